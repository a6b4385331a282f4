#!/usr/bin/env bash
# One H100, the tree of this stop (split-k o/down at 33-128 rows, one-pass sampling): the
# Must-show figures again. nano-vllm's workload twice; decode steps of Qwen3-0.6B and the
# Llama-3-8B shape against the HBM roofline; the 8B 4 x 2,048 prefill against the GEMM peak;
# served rounds against bench engine (SmolLM2 shape, random Q8_0 in f16).
source scripts/gpu/session.sh
for r in 1 2; do
  eng nano-$r $NANO
  grep -E "^HBM" $L/engine-nano-$r.log | cut -c1-250; kinds nano-$r
done
dec q3 $Q 16,64,256 1024
for r in 1 2; do dec l8b-$r $E 16,64,256 1024; done
timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
served 2
finish
