#!/usr/bin/env bash
# Products of at most 8 rows on the gemv kernel against cuBLAS (TANDEM_GEMV=off): checks, end to
# end, decode steps of small batches, one step's kernels, and the workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL|gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; sec check-f16 X=1 $g check f16
for a in llama qwen3 phi3 mistral qwen2; do sec e2e-tiny-$a X=1 $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-llama-bf16 X=1 $g e2e tests/data/tiny-llama bf16
dec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|instead of the gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-120; }
dec qwen3 X=1 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,2,4,8,16 100-2048
dec smollm2 X=1 $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,4,8 100-300
dec l8b X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,8 1024
timeout 200 python3 scripts/gpu/step_kernels.py --bin $g .gpu/bin/configs/qwen3-0.6b.json 1 100-2048 > $L/kernels-qwen3-b1.log 2>&1; head -16 $L/kernels-qwen3-b1.log | cut -c1-110
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 200 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-60 | tr '\n' ';')"; }
for r in 1 2; do eng gemv-$r X=1; eng cublas-$r TANDEM_GEMV=off; done
tar czf $OUT/logs.tgz -C $L .
