#!/usr/bin/env bash
# One H200: after review (decode, mixed-step and all-reduce captures share one capture
# function): e2e, a decode benchmark with its graph census, bench-mixed, the Qwen3 mixed engine
# workload (digest).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in tiny-llama tiny-qwen3; do timeout 100 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail"; done
timeout 150 $g bench-decode $Q 16,64,256 100-2048 > $L/decode-Q.log 2>&1; echo "decode Q rc=$?"; grep -E "decode .* step|graph:" $L/decode-Q.log | cut -c1-170
timeout 100 $g bench-mixed $S 256 100-300 1x108,4x16 f16 > $L/mixed-S.log 2>&1; echo "mixed S rc=$?"; grep "mixed step" $L/mixed-S.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
timeout 120 $t bench engine --device cuda --load-format dummy --model $Q --num-prompts 1024 --input-len 512 --min-input-len 16 --output-len 256 --min-output-len 16 --max-num-seqs 128 --max-num-batched-tokens 1024 --temperature 0.6 > $L/engine-qwen3-mixed.log 2>&1
echo "qwen3-mixed rc=$?: $(grep -E 'throughput|digest' $L/engine-qwen3-mixed.log | tr -s ' ' | cut -c1-80 | tr '\n' ';')"
tar czf $OUT/logs.tgz -C $L .
