#!/usr/bin/env bash
# Prefill of the Qwen3-0.6B shape (16 x 1024) and Llama-3-8B (4 x 2048): the q/k norm + RoPE + KV
# store kernel with fewer registers (more warps per SM, more loads in flight), the prefill
# kernel's CTA size and CTAs per SM; stage profiles of each.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
pf() { local n="$1" c="$2" b="$3" len="$4"; shift 4; timeout 200 env "$@" $g bench-prefill .gpu/bin/configs/$c.json $b $len > $L/prefill-$n.log 2>&1; echo "== prefill-$n rc=$?"; grep -vE "^\s*$" $L/prefill-$n.log | head -2 | cut -c15-400; }
for r in 1 2; do
pf qwen3-default-$r qwen3-0.6b 16 1024 X=1
pf qwen3-rope16-$r qwen3-0.6b 16 1024 TANDEM_CUDA_DEFINES=ROPE_MIN_BLOCKS=16
pf qwen3-rope12-$r qwen3-0.6b 16 1024 TANDEM_CUDA_DEFINES=ROPE_MIN_BLOCKS=12
done
pf qwen3-pf8 qwen3-0.6b 16 1024 TANDEM_PF_WARPS=8
pf qwen3-pf2 qwen3-0.6b 16 1024 TANDEM_PF_WARPS=2
pf qwen3-pfmin2 qwen3-0.6b 16 1024 TANDEM_CUDA_DEFINES=PF_MIN_BLOCKS=2
pf l8b-default llama-3-8b 4 2048 X=1
pf l8b-rope16 llama-3-8b 4 2048 TANDEM_CUDA_DEFINES=ROPE_MIN_BLOCKS=16
tar czf $OUT/logs.tgz -C $L .
