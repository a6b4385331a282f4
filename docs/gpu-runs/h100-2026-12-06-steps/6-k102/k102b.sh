#!/usr/bin/env bash
# One H100: nano-vllm's workload at temperature 0.6 (its own) and greedy, alternating, with the
# steps by kind: whether device sampling is what puts the engine's decode steps ~0.7 ms above
# bench-decode's step of the same bytes (k102: Qwen3 at 192 sequences over 100-1,500, 7.154 ms).
source scripts/gpu/session.sh
G="--model $Q --workload-file $C/w.json --temperature 0 --max-num-seqs 256 --max-num-batched-tokens 16384"
for r in 1 2; do
  eng nano-t06-$r $NANO; grep -A7 "^steps by kind" $L/engine-nano-t06-$r.log | grep -E "129-256|65-128" | cut -c1-220
  eng nano-t0-$r $G; grep -A7 "^steps by kind" $L/engine-nano-t0-$r.log | grep -E "129-256|65-128" | cut -c1-220
done
finish
