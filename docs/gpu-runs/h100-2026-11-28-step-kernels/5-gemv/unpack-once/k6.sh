#!/usr/bin/env bash
# The gemv kernel unpacking each chunk once, against cuBLAS, at batch 1-8; 4 or 8 chunks in flight.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16
dec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|instead of the gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-100; }
for u in 4 8; do
dec qwen3-u$u TANDEM_CUDA_DEFINES=GEMV_UNROLL=$u $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,2,4,8 100-2048
dec smollm2-u$u TANDEM_CUDA_DEFINES=GEMV_UNROLL=$u $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,2,4,8 100-300
done
dec l8b X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,2,4 1024
tar czf $OUT/logs.tgz -C $L .
