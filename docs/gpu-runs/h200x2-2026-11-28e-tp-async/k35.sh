#!/usr/bin/env bash
# Async scheduling under tensor parallelism (two NVIDIA H200): every rank samples its own copy
# of the logits, so step N+1 is launched before step N is collected. Output digests with async
# scheduling on and off (greedy and sampled, tiny Llama files, TP=2 and TP=1), and output tok/s
# of nano-vllm's workload on the Qwen3-0.6B and Llama-3-8B shapes at TP=2, async on and off.
set -u
export NCCL_NVLS_ENABLE=0
t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
eng() { # name args...
  local n=$1; shift
  timeout 300 $t bench engine --device cuda "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"
  grep -E "output tok/s|outputs digest|rror|steps" $L/$n.log | head -5 | cut -c1-200
}
tiny="--model tests/data/tiny-llama --num-prompts 64 --input-len 100 --min-input-len 20 --output-len 64 --min-output-len 64 --max-num-seqs 32"
for temp in 0 0.8; do
  eng tiny-tp1-t$temp $tiny --temperature $temp
  eng tiny-tp2-async-t$temp $tiny --temperature $temp --tensor-parallel-size 2
  eng tiny-tp2-sync-t$temp $tiny --temperature $temp --tensor-parallel-size 2 --no-async-scheduling
done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null
for cfg in qwen3-0.6b llama-3-8b; do
  w="--load-format dummy --model .gpu/bin/configs/$cfg.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 --tensor-parallel-size 2"
  eng $cfg-tp2-async $w
  eng $cfg-tp2-sync $w --no-async-scheduling
  eng $cfg-tp2-async-2 $w
done
tar czf $OUT/logs.tgz -C $L .
