#!/usr/bin/env bash
# The Must-show figures on the binaries of this stop's main (tandem-gpu and tandem built
# at the commit named in the README), one machine, each limit measured in the same run: the
# greedy and sampling checks, nano-vllm's workload twice, decode steps against the HBM roofline
# (Llama-3-8B shape at 64 and 256 sequences, Qwen3-0.6B), the 8B 4 x 2,048 prefill against the
# GEMM peak, served rounds against bench engine (SmolLM2 shape, random Q8_0 in f16).
source scripts/gpu/session.sh
chk bf16; chk f16
for r in 1 2; do
  eng nano-$r $NANO
  grep -E "^HBM" $L/engine-nano-$r.log | cut -c1-250; kinds nano-$r
done
dec l8b $E 16,64,256 1024
dec q3 $Q 16,64,256 1024
timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
served 2
finish
