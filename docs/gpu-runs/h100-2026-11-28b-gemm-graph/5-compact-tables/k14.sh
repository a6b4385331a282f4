#!/usr/bin/env bash
# Decode graphs' block tables at the stride of the batch's longest table (one KV group) instead of
# max_model_len's: checks, then nano-vllm's workload against the tree before, alternating.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; o=.gpu/old/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
for a in llama qwen3 phi3 mistral qwen2; do sec e2e-tiny-$a X=1 $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-qwen3-bf16 X=1 $g e2e tests/data/tiny-qwen3 bf16
ls tests/data/ | head -20 > $L/testdata.txt
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; local b="$2"; shift 2; local f=$L/engine-$n.log; timeout 100 env "$@" $b bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|decode phase|per step' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; }
for r in 1 2 3; do eng new-$r $t X=1; eng old-$r $o X=1; done
eng new-bs64 $t TANDEM_BLOCK_SIZE=64
tar czf $OUT/logs.tgz -C $L .
