#!/usr/bin/env bash
# Async scheduling after sequences whose last token is on the device leave the running set at once (same checks as k18.sh).
# 1) outputs: the tiny random-weight models through the whole engine with EOS stops (requests end
#    early, so steps are planned past a sequence's end), async / sync, digests
#    compared; 2) nano-vllm's workload with and without async scheduling, alternating.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
lscpu | grep -E "Model name|^CPU\(s\)" | tee $L/cpu.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec e2e-tiny-llama X=1 $g e2e tests/data/tiny-llama f16
eos() { local n="$1"; shift; local f=$L/eos-$n.log; timeout 120 $t bench engine --device cuda --model tests/data/$m --num-prompts 200 --input-len 96 --min-input-len 4 --output-len 96 --min-output-len 1 --temperature 0.9 --stop-at-eos --max-num-seqs 64 --max-num-batched-tokens 2048 "$@" > $f 2>&1; echo "eos-$n rc=$? $(grep -E 'digest|output tokens|throughput|preemptions' $f | tr -s ' ' | tr '\n' ';' | cut -c1-200)"; }
for m in tiny-llama tiny-qwen3 tiny-mistral; do
  eos $m-async; eos $m-sync --no-async-scheduling
  eos $m-async-recompute --kv-cache-memory 163840
  eos $m-sync-recompute --kv-cache-memory 163840 --no-async-scheduling
  eos $m-async-swap --kv-cache-memory 163840 --preemption-mode swap
  eos $m-sync-swap --kv-cache-memory 163840 --preemption-mode swap --no-async-scheduling
done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 "$@" > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|decode phase|per step' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng async-$r; eng sync-$r --no-async-scheduling; done
tar czf $OUT/logs.tgz -C $L .
