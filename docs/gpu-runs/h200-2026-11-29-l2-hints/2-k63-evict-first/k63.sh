#!/usr/bin/env bash
# One H200: the decode kernels' KV page copies marked L2 evict-first (now the default), with a
# 256-byte L2 prefetch size (TANDEM_KV_L2_256B), against the tree before (old-tandem-gpu) and
# against the hint dropped (TANDEM_KV_EVICT_NORMAL) for the whole-engine workloads.
set -u
g=.gpu/bin/tandem-gpu; o=.gpu/pack/old-tandem-gpu; t=.gpu/tandem/tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
run() { # tag shape batches ctx [old] env...
  local tag=$1 cfg=$2 bs=$3 ctx=$4; shift 4; local b=$g; [ "$1" = old ] && { b=$o; shift; }
  timeout 150 env "$@" $b bench-decode $cfg $bs $ctx > $L/decode-$tag.log 2>&1
  echo "$tag rc=$?: $(grep -E 'decode .* step' $L/decode-$tag.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')| 16-row: $(grep -oE 'decode tiles: step [0-9.]+' $L/decode-$tag.log | awk '{print $4}' | tr '\n' ' ')| chain: $(grep -oE 'back to back: [0-9.]+' $L/decode-$tag.log | awk '{print $4}' | tr '\n' ' ')"
}
W=TANDEM_CUDA_DEFINES=TANDEM_KV_L2_256B
for r in 1 2; do
  run Q-old-r$r $Q 16,64,256 100-2048 old X=1
  run Q-new-r$r $Q 16,64,256 100-2048 X=1
  run Q-256-r$r $Q 16,64,256 100-2048 $W
done
run S-old $S 1,64,256 100-300 old X=1
run S-new $S 1,64,256 100-300 X=1
run B-old $B 16,64,256 1024 old X=1
run B-new $B 16,64,256 1024 X=1
run B-256 $B 16,64,256 1024 $W
for r in 1 2; do for v in new normal; do e=X=1; [ $v = normal ] && e=TANDEM_CUDA_DEFINES=TANDEM_KV_EVICT_NORMAL
  timeout 200 env $e $t bench engine --device cuda --load-format dummy --model $Q --workload-file .gpu/pack/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano-$v-r$r.log 2>&1
  echo "nano-vllm $v r$r rc=$?: $(grep -E 'throughput|digest' $L/engine-nano-$v-r$r.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done; done
for v in new normal; do e=X=1; [ $v = normal ] && e=TANDEM_CUDA_DEFINES=TANDEM_KV_EVICT_NORMAL
  timeout 120 env $e $t bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 1024 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served-$v.log 2>&1
  echo "served workload $v rc=$?: $(grep -E 'throughput|digest' $L/engine-served-$v.log | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done
timeout 200 $g check bf16 > $L/check-bf16.log 2>&1; echo "check bf16 rc=$? pass=$(grep -c PASS $L/check-bf16.log) fail=$(grep -c FAIL $L/check-bf16.log)"
tar czf $OUT/logs.tgz -C $L .
