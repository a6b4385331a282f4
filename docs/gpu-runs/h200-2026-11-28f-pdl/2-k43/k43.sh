#!/usr/bin/env bash
# One NVIDIA H200: which programmatic-dependent edges pay. Qwen3-0.6B and SmolLM2 shapes,
# decode graphs: plain launches, every kernel dependent, the wait without the early trigger,
# and every kernel dependent but one kind (TANDEM_PDL_SKIP).
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
S=docs/gpu-runs/h100-2026-11-28-step-kernels/1-ncu/smollm2-135m-shape.json
run() { local n="$1" cfg="$2" b="$3" c="$4"; shift 4; local f=$L/decode-$n.log; timeout 120 env "$@" $g bench-decode $cfg $b $c > $f 2>&1; echo "$n: $(grep -E 'decode .* step' $f | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2 \3/' | tr '\n' ' ')"; }
Q=.gpu/bin/configs/qwen3-0.6b.json
for r in 1 2; do
run q-off-$r $Q 1,16,64,256 100-2048 TANDEM_PDL=off
run q-on-$r $Q 1,16,64,256 100-2048 X=1
run q-notrig-$r $Q 1,16,64,256 100-2048 TANDEM_CUDA_DEFINES=TANDEM_PDL_NO_TRIGGER
run q-skipatt-$r $Q 1,16,64,256 100-2048 TANDEM_PDL_SKIP=attention_dec128,attention_mma128
done
run q-skiprope $Q 1,16,64,256 100-2048 TANDEM_PDL_SKIP=qkv_rope_store_p2
run q-skipnorm $Q 1,16,64,256 100-2048 TANDEM_PDL_SKIP=rmsnorm_v1
run q-skipsilu $Q 1,16,64,256 100-2048 TANDEM_PDL_SKIP=silu_mul
run q-onlyatt $Q 1,16,64,256 100-2048 TANDEM_PDL_SKIP=qkv_rope_store_p2,rmsnorm_v1,silu_mul,embed,sample_rows,take_sampled,mask_rows
run s-off $S 1,64,256 100-300 TANDEM_PDL=off
run s-on $S 1,64,256 100-300 X=1
run s-notrig $S 1,64,256 100-300 TANDEM_CUDA_DEFINES=TANDEM_PDL_NO_TRIGGER
run s-skipatt $S 1,64,256 100-300 TANDEM_PDL_SKIP=attention_dec64,attention_mma64
tar czf $OUT/logs.tgz -C $L .
