#!/usr/bin/env bash
# One NVIDIA H200, this stop's final tree (the LM head now behind CudaBackend::lm_head, the
# group-of-8 kernel rule): kernel checks, the tiny models end to end, Qwen3 decode, nano-vllm's
# workload (digest and output tok/s).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check-$d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; grep -E "FAIL" $L/check-$d.log | cut -c1-150; done
for m in tiny-llama tiny-qwen3 tiny-mistral tiny-qwen2 tiny-phi3; do timeout 120 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e-$m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail"; done
timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 16,64,256 100-2048 > $L/decode-qwen3.log 2>&1; grep -E "limit:|decode qwen3" $L/decode-qwen3.log | cut -c16-200
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng default-$r X=1; done
tar czf $OUT/logs.tgz -C $L .
