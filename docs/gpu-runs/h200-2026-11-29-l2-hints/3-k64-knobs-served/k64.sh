#!/usr/bin/env bash
# One H200, the evict-first build: does keeping the L2 for the split partials change the best
# split count or pipeline depth (TANDEM_SPLIT_CTAS_PER_SM, TANDEM_MMA_STAGES)? And the served
# workload (SmolLM2 shape, 4,096 requests of 108 + 128 tokens) with and without the hint.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
run() { # tag shape batches ctx env...
  local tag=$1 cfg=$2 bs=$3 ctx=$4; shift 4
  timeout 150 env "$@" $g bench-decode $cfg $bs $ctx > $L/decode-$tag.log 2>&1
  echo "$tag rc=$?: $(grep -E 'decode .* step' $L/decode-$tag.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')| chain: $(grep -oE 'back to back: [0-9.]+' $L/decode-$tag.log | awk '{print $4}' | tr '\n' ' ')"
}
run Q-def $Q 16,64,256 100-2048 X=1
run Q-split3 $Q 16,64,256 100-2048 TANDEM_SPLIT_CTAS_PER_SM=3
run Q-split4 $Q 16,64,256 100-2048 TANDEM_SPLIT_CTAS_PER_SM=4
run Q-stages3 $Q 16,64,256 100-2048 TANDEM_MMA_STAGES=3
run Q-def2 $Q 16,64,256 100-2048 X=1
for r in 1 2; do for v in new normal; do e=X=1; [ $v = normal ] && e=TANDEM_CUDA_DEFINES=TANDEM_KV_EVICT_NORMAL
  timeout 120 env $e $t bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 4096 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served-$v-r$r.log 2>&1
  echo "served workload $v r$r rc=$?: $(grep -E 'throughput|digest|^steps' $L/engine-served-$v-r$r.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done; done
timeout 200 $g check f16 > $L/check-f16.log 2>&1; echo "check f16 rc=$? pass=$(grep -c PASS $L/check-f16.log) fail=$(grep -c FAIL $L/check-f16.log)"
for m in tiny-llama tiny-qwen3; do timeout 100 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(tail -1 $L/e2e-$m.log | cut -c1-100)"; done
tar czf $OUT/logs.tgz -C $L .
