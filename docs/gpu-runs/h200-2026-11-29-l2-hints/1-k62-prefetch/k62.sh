#!/usr/bin/env bash
# One H200: weights prefetched into L2 during each layer's attention (TANDEM_L2_PREFETCH_MB) and
# KV pages copied evict-first (TANDEM_KV_EVICT_FIRST), against the tree before (old-tandem-gpu).
set -u
g=.gpu/bin/tandem-gpu; o=.gpu/pack/old-tandem-gpu; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
run() { # tag shape batches ctx env...
  local tag=$1 cfg=$2 bs=$3 ctx=$4; shift 4; local b=$g; [ "$1" = old ] && { b=$o; shift; }
  timeout 150 env "$@" $b bench-decode $cfg $bs $ctx > $L/decode-$tag.log 2>&1
  echo "$tag rc=$?: $(grep -E 'decode .* step' $L/decode-$tag.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ') chain: $(grep -oE 'back to back: [0-9.]+' $L/decode-$tag.log | awk '{print $4}' | tr '\n' ' ')"
}
E=TANDEM_CUDA_DEFINES=TANDEM_KV_EVICT_FIRST
run Q-old $Q 16,64,256 100-2048 old X=1
run Q-new $Q 16,64,256 100-2048 X=1
run Q-pf16 $Q 16,64,256 100-2048 TANDEM_L2_PREFETCH_MB=16
run Q-pf32 $Q 16,64,256 100-2048 TANDEM_L2_PREFETCH_MB=32
run Q-ev $Q 16,64,256 100-2048 $E
run Q-pf32ev $Q 16,64,256 100-2048 TANDEM_L2_PREFETCH_MB=32 $E
run Q-old2 $Q 16,64,256 100-2048 old X=1
run S-old $S 1,64,256 100-300 old X=1
run S-pf8ev $S 1,64,256 100-300 TANDEM_L2_PREFETCH_MB=8 $E
run S-pf8 $S 1,64,256 100-300 TANDEM_L2_PREFETCH_MB=8
run B-old $B 16,64,256 1024 old X=1
run B-pf32ev $B 16,64,256 1024 TANDEM_L2_PREFETCH_MB=32 $E
tar czf $OUT/logs.tgz -C $L .
