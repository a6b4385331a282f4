#!/usr/bin/env bash
# gemm_rows (products of 2-64 rows on tensor cores, k split across CTAs): checks, per-GEMM
# timing against cuBLAS on cold weights, decode steps with and without it, nano-vllm's workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check-$d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; grep -E "FAIL|gemm " $L/check-$d.log | cut -c1-170 | head -40; done
timeout 200 $g bench-gemm .gpu/bin/configs/qwen3-0.6b.json 2,8,16,32,64 > $L/gemm-qwen3.log 2>&1; grep -E "gemm|20 different|all shapes" $L/gemm-qwen3.log | sed -E 's/cuBLASLt first.*-> /-> /' | cut -c16-200
timeout 200 $g bench-gemm .gpu/bin/configs/llama-3-8b.json 8,64 > $L/gemm-8b.log 2>&1; grep -E "20 different" $L/gemm-8b.log | cut -c16-200
bd() { local n="$1"; shift; timeout 200 env "$@" $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 2,8,16,32,64,128 100-2048 > $L/decode-$n.log 2>&1; echo "== decode-$n rc=$?"; grep -E "limit:|decode qwen3|every product" $L/decode-$n.log | cut -c16-190; }
bd default X=1
bd waves2 TANDEM_GEMM_ROWS_WAVES=2
bd waves4 TANDEM_GEMM_ROWS_WAVES=4
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|per step' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng rows-$r X=1; eng cublas-$r TANDEM_GEMM_ROWS=off; done
timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,16,64 1024 > $L/decode-8b.log 2>&1; grep -E "limit:|decode |every product" $L/decode-8b.log | cut -c16-190
tar czf $OUT/logs.tgz -C $L .
