#!/usr/bin/env bash
# One H100, the tree of this stop (split-k o/down, one-pass sampling, cuBLASLt algorithms chosen
# by timing): the decode Must-show figures again, nano-vllm's workload and the 8B prefill.
source scripts/gpu/session.sh
for r in 1 2; do eng nano-$r $NANO; grep -E "^HBM" $L/engine-nano-$r.log | cut -c1-200; done
kinds nano-1
for r in 1 2; do dec l8b-$r $E 16,64,256 1024; done
dec q3 $Q 16,64,256 1024
timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
finish
