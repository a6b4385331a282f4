#!/usr/bin/env bash
# The committed tree: one-row products on the gemv kernel, 4-warp decode kernel, new q/k norm +
# RoPE and rmsnorm kernels. Checks, end to end, decode steps, the workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
timeout 60 $g info > $L/info.log 2>&1; grep dec $L/info.log | sed -E 's/^\[[^]]*\] //'
sec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; sec check-f16 X=1 $g check f16
for a in llama qwen3 phi3 mistral qwen2; do sec e2e-tiny-$a X=1 $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-qwen3-bf16 X=1 $g e2e tests/data/tiny-qwen3 bf16
dec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|instead of the gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
dec qwen3 X=1 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,32,64,128,256 100-2048
dec smollm2 X=1 $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300
dec l8b X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 200 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|per step' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; }
eng 1 X=1; eng 2 X=1; eng 3 X=1
tar czf $OUT/logs.tgz -C $L .
