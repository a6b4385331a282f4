#!/usr/bin/env bash
# gate|up written in the 16-bit type and silu_mul16 reading it (one-row products on gemv with a
# 16-bit output), against the tree before (e83d031), same call.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; og=.gpu/old/tandem-gpu; ot=.gpu/old/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; sec check-f16 X=1 $g check f16
grep -E "silu|gemm 1x" $L/check-bf16.log | sed -E 's/^\[[^]]*\] //' | cut -c1-120
for a in llama qwen3 phi3 mistral qwen2; do sec e2e-tiny-$a X=1 $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-qwen3-bf16 X=1 $g e2e tests/data/tiny-qwen3 bf16
sec e2e-tiny-llama-bf16 X=1 $g e2e tests/data/tiny-llama bf16
grep -E "nats|worst|max" $L/e2e-tiny-qwen3-bf16.log | head -5 | cut -c1-160
pf() { local n="$1"; shift; timeout 150 "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "prefill .*prefill kernel\)|eager stages" $L/$n.log | head -2 | sed -E 's/^\[[^]]*\] //' | cut -c1-420; }
pf prefill-l8b-new $g bench-prefill .gpu/bin/configs/llama-3-8b.json 4 2048
pf prefill-l8b-old $og bench-prefill .gpu/bin/configs/llama-3-8b.json 4 2048
pf prefill-qwen3-new $g bench-prefill .gpu/bin/configs/qwen3-0.6b.json 16 1024
pf prefill-qwen3-old $og bench-prefill .gpu/bin/configs/qwen3-0.6b.json 16 1024
dq() { local n="$1"; shift; timeout 150 "$@" > $L/$n.log 2>&1; echo "== $n rc=$? $(grep -E 'decode .* step' $L/$n.log | sed -E 's/^\[[^]]*\] //' | grep -oE 'batch +[0-9]+|step [0-9.]+ ms, [0-9.]+ GB read, roofline [0-9.]+ ms -> [0-9.]+%' | tr '\n' ' ')"; }
dq l8b-new $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024
dq l8b-old $og bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024
dq qwen3-new $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,64,256 100-2048
dq qwen3-old $og bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,64,256 100-2048
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; local b="$2"; local f=$L/engine-$n.log; timeout 100 $b bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|prefill phase|decode phase' $f | tr -s ' ' | cut -c1-80 | tr '\n' ';')"; }
for r in 1 2; do eng new-$r $t; eng old-$r $ot; done
tar czf $OUT/logs.tgz -C $L .
