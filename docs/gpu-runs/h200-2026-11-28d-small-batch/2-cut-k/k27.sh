#!/usr/bin/env bash
# Projections of few rows cut along k (o and down of small matrices), their slices added up by the
# next RMSNorm's kernel: checks, decode steps with and without (logits compared), nano-vllm's workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check-$d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; grep -E "FAIL|slices" $L/check-$d.log | cut -c1-150; done
bd() { local n="$1"; shift; timeout 200 env "$@" $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,2,8,16,32,64,128 100-2048 > $L/decode-$n.log 2>&1; echo "== decode-$n rc=$?"; grep -E "limit:|decode qwen3|whole" $L/decode-$n.log | cut -c16-250; }
bd default X=1
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|per step' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng cut-$r X=1; eng whole-$r TANDEM_CUT_K=off; done
# Requests ending at EOS through the whole engine, 1-64 sequences a step, cut and whole.
eos() { local n="$1"; shift; local f=$L/eos-$n.log; timeout 120 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --num-prompts 128 --input-len 512 --min-input-len 16 --output-len 256 --min-output-len 1 --temperature 0 --max-num-seqs 16 --max-num-batched-tokens 2048 > $f 2>&1; echo "eos-$n rc=$? $(grep -E 'digest|throughput' $f | tr -s ' ' | tr '\n' ';' | cut -c1-200)"; }
eos cut X=1; eos whole TANDEM_CUT_K=off
timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,16,64 1024 > $L/decode-8b.log 2>&1; grep -E "limit:|decode |whole" $L/decode-8b.log | cut -c16-220
tar czf $OUT/logs.tgz -C $L .
