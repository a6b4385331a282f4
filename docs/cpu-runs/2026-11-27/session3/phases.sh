#!/usr/bin/env bash
# bench engine on the tiny random Llama, 1,024 requests of 108 + 128 tokens, 256 running, 8,192 tokens a step; three runs.
for i in 1 2 3; do
  TANDEM_CPU_KERNEL=auto target/release/tandem bench engine --model tests/data/tiny-llama --num-prompts 1024 --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 2>&1 | grep -E "per step"
done
