#!/usr/bin/env bash
# The q/k norm + RoPE + KV store kernels for heads up to 128 wide bounded to 16 CTAs per SM (the
# default now): checks, the tiny models end to end, prefill stages, decode, nano-vllm's workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check-$d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; grep -E "FAIL" $L/check-$d.log | cut -c1-150; done
for m in tiny-llama tiny-qwen3 tiny-mistral tiny-qwen2 tiny-phi3; do timeout 120 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e-$m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail"; done
pf() { local n="$1" c="$2" b="$3" len="$4"; shift 4; timeout 200 env "$@" $g bench-prefill .gpu/bin/configs/$c.json $b $len > $L/prefill-$n.log 2>&1; echo "== prefill-$n rc=$?"; grep -vE "^\s*$" $L/prefill-$n.log | head -2 | cut -c15-200; grep "eager stages" $L/prefill-$n.log | head -1 | grep -oE "rope, kv store [0-9.]+ ms"; }
pf qwen3 qwen3-0.6b 16 1024 X=1
pf l8b llama-3-8b 4 2048 X=1
timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 16,64,256 100-2048 > $L/decode-qwen3.log 2>&1; grep -E "limit:|decode qwen3" $L/decode-qwen3.log | cut -c16-200
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|prefill phase' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng default-$r X=1; done
tar czf $OUT/logs.tgz -C $L .
