#!/usr/bin/env bash
# Skinny tensor-core GEMM for products of 2..64 rows against cuBLAS (TANDEM_SKINNY=off), same binary.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; grep skinny $L/check-bf16.log | sed -E 's/^\[[^]]*\] //' | cut -c1-120
sec check-f16 X=1 $g check f16
sec e2e-tiny-qwen3 X=1 $g e2e tests/data/tiny-qwen3 f16
sec e2e-tiny-llama-bf16 X=1 $g e2e tests/data/tiny-llama bf16
timeout 150 $g bench-gemm .gpu/bin/configs/qwen3-0.6b.json 1,8,16,32,64,128 > $L/gemm-qwen3.log 2>&1; echo "gemm-qwen3 rc=$?"
grep -E "gemm|skinny|all shapes" $L/gemm-qwen3.log | grep -v cuBLASLt | sed -E 's/^\[[^]]*\] //' | cut -c1-200
timeout 120 $g bench-gemm .gpu/bin/configs/llama-3-8b.json 16,64 > $L/gemm-l8b.log 2>&1; echo "gemm-l8b rc=$?"
grep -E "skinny|all shapes|20 different" $L/gemm-l8b.log | sed -E 's/^\[[^]]*\] //' | cut -c1-200
dec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|instead of the gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-120; }
dec qwen3 X=1 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,8,32,64,128 100-2048
dec l8b X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 16,64 1024
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|per step' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; }
eng skinny-1 X=1; eng cublas-1 TANDEM_SKINNY=off; eng skinny-2 X=1; eng cublas-2 TANDEM_SKINNY=off
tar czf $OUT/logs.tgz -C $L .
