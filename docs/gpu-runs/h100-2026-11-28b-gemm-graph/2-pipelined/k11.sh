#!/usr/bin/env bash
# Skinny GEMM v2: W double-buffered in registers, split-K fixup loads issued together; SK_UNROLL 2 vs 4.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16
gm() { local n="$1"; shift; timeout 150 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "^\[.*gemm|skinny|all shapes|20 different" $L/$n.log | sed -E 's/^\[[^]]*\] //' | sed -E 's/cuBLASLt first.*-> //; s/cut along k.*//' | cut -c1-200; }
gm gemm-qwen3-u2 X=1 $g bench-gemm .gpu/bin/configs/qwen3-0.6b.json 1,8,16,64
gm gemm-qwen3-u4 TANDEM_CUDA_DEFINES=SK_UNROLL=4 $g bench-gemm .gpu/bin/configs/qwen3-0.6b.json 1,8,16,64
gm gemm-l8b-u2 X=1 $g bench-gemm .gpu/bin/configs/llama-3-8b.json 16,64
gm gemm-l8b-u4 TANDEM_CUDA_DEFINES=SK_UNROLL=4 $g bench-gemm .gpu/bin/configs/llama-3-8b.json 16,64
tar czf $OUT/logs.tgz -C $L .
