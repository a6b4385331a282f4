#!/usr/bin/env bash
# One H100: the o and down projections of 33-256 rows cut along k (cuBLAS strided-batched, the
# slices' partial sums added in by the RMSNorm after them; TANDEM_SPLIT_K=auto, the default)
# against the product accumulated into the residual by one cuBLAS call (TANDEM_SPLIT_K=off).
# The checks (new: the split-k product and rmsnorm_parts); each shape's products cut into 2, 4,
# 8 slices; decode steps of Qwen3-0.6B, Llama-3-8B and the SmolLM2 shape both ways, alternating;
# fixed slice counts on Qwen3; nano-vllm's workload both ways, alternating.
source scripts/gpu/session.sh
chk bf16
chk f16
gem q3 $Q 48,64,128,256
gem l8b $E 64,256
for r in 1 2; do
  dec q3-auto-$r $Q 16,64,128,256 1024
  TANDEM_SPLIT_K=off dec q3-off-$r $Q 16,64,128,256 1024
done
for s in 2 4 8; do TANDEM_SPLIT_K=$s dec q3-s$s $Q 64,128,256 1024; done
dec l8b-auto $E 16,64,256 1024
TANDEM_SPLIT_K=off dec l8b-off $E 16,64,256 1024
dec smol-auto $S 64,256 100-300
TANDEM_SPLIT_K=off dec smol-off $S 64,256 100-300
for r in 1 2; do
  eng nano-auto-$r $NANO; kinds nano-auto-$r
  TANDEM_SPLIT_K=off eng nano-off-$r $NANO; kinds nano-off-$r
done
finish
