#!/usr/bin/env bash
# One H200: where a step's launch goes on the host. `bench engine` (its per-step line now with the
# device's own time and the launch's parts) on peer.sh's served-round requests (2,048 of 108 + 128
# tokens at 256 sequences, SmolLM2 shape from a random Q8_0 file) and on nano-vllm's workload.
source scripts/gpu/session.sh
python3 scripts/gpu/random_gguf.py $C/smollm2-meta.gguf /tmp/r.gguf > /dev/null
for r in 1 2; do
  timeout 120 $t bench engine --device cuda --model /tmp/r.gguf --num-prompts 2048 --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-smol-$r.log 2>&1
  echo "$(el) smol r$r rc=$?"; grep -E "^throughput|^per step|^device|^launch|^steps" $L/engine-smol-$r.log
done
eng nano $NANO; grep -E "^per step|^device|^launch" $L/engine-nano.log
finish
