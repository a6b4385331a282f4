#!/usr/bin/env bash
# One H200: the tree of this stop (page-locked uploads taken back out; copy-on-write page copies
# queued without waiting for the stream). The checks (their swap/copy round trip included), then
# `bench engine` on peer.sh's served-round requests (SmolLM2 shape, random Q8_0 run in f16) and on
# nano-vllm's workload (Qwen3-0.6B shape, bf16).
source scripts/gpu/session.sh
chk bf16
grep -E "swap out, overwrite" $L/check-bf16.log | cut -c1-160
python3 scripts/gpu/random_gguf.py $C/smollm2-meta.gguf /tmp/r.gguf > /dev/null
for r in 1 2; do
  timeout 120 $t bench engine --device cuda --model /tmp/r.gguf --num-prompts 2048 --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-smol-$r.log 2>&1
  echo "$(el) smol r$r rc=$?"; grep -E "^throughput|^per step|^device|^launch" $L/engine-smol-$r.log | cut -c1-220
done
eng nano $NANO; grep -E "^per step|^device|^launch|^HBM" $L/engine-nano.log | cut -c1-240
finish
