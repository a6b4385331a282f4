#!/usr/bin/env bash
# One NVIDIA H200 (of a two-GPU host): which GEMM -> own-kernel dependent edges cost the 8B
# shape at batch 16 — each kind of own kernel launched plainly in turn (TANDEM_PDL_SKIP, beside
# the attention kernels), on three shapes.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
A=attention,attention_decode,attention_mma64,attention_mma128,attention_dec64,attention_dec128,attention_prefill64,attention_prefill128
S=docs/gpu-runs/h100-2026-11-28-step-kernels/1-ncu/smollm2-135m-shape.json
run() { local n="$1" cfg="$2" b="$3" c="$4"; shift 4; local f=$L/decode-$n.log; timeout 120 env "$@" $g bench-decode $cfg $b $c > $f 2>&1; echo "$n: $(grep -E 'decode .* step' $f | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2/' | tr '\n' ' ')"; }
for m in l8b:.gpu/bin/configs/llama-3-8b.json:1024 q:.gpu/bin/configs/qwen3-0.6b.json:100-2048 s:$S:100-300; do
  IFS=: read n cfg c <<< "$m"
  for r in 1 2; do
    run $n-off-$r $cfg 16,64 $c TANDEM_PDL=off
    run $n-on-$r $cfg 16,64 $c X=1
    run $n-skipnorm-$r $cfg 16,64 $c TANDEM_PDL_SKIP=$A,rmsnorm_v1,rmsnorm_v2,rmsnorm_v4,rmsnorm
    run $n-skiprope-$r $cfg 16,64 $c TANDEM_PDL_SKIP=$A,qkv_rope_store_p1,qkv_rope_store_p2,qkv_rope_store_p4,qkv_rope_store
    run $n-skipsilu-$r $cfg 16,64 $c TANDEM_PDL_SKIP=$A,silu_mul
  done
done
tar czf $OUT/logs.tgz -C $L .
