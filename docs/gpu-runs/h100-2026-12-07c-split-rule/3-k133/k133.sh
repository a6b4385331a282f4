#!/usr/bin/env bash
# k131's binaries, no variable set: the issue's decode and prefill limits in one run — the
# Llama-3-8B shape's decode step at 64 and 256 sequences (twice), its 4 x 2048 prefill against
# the GEMM peak measured beside it, nano-vllm's workload, and the f16 check.
source scripts/gpu/session.sh
dec l8b-1 $E 64,256 1024
timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill llama|GEMM|peak" $L/prefill-8b.log | cut -c1-220
dec l8b-2 $E 64,256 1024
eng nano-1 $NANO; grep -E "^HBM" $L/engine-nano-1.log | cut -c1-250
chk f16
finish
