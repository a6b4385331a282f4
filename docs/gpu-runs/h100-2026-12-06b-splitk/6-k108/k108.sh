#!/usr/bin/env bash
# One H100: the decode graphs' cuBLAS products (33+ rows) timed against cuBLASLt's first six
# candidates on the model's own matrices before each graph is captured, the faster kept
# (TANDEM_GEMM_TUNE, on) against cuBLAS's choice everywhere (=off), alternating: the Llama-3-8B
# and Qwen3-0.6B shapes' steps (bench-decode prints what each size's tuning found), nano-vllm's
# workload (and how long its graphs took to capture).
source scripts/gpu/session.sh
for r in 1 2; do
  dec l8b-$r $E 16,64,128,256 1024
  TANDEM_GEMM_TUNE=off dec l8b-off-$r $E 16,64,128,256 1024
done
grep -E "on the model's matrices" $L/decode-l8b-1.log | cut -c1-200
for r in 1 2; do
  dec q3-$r $Q 64,128,256 1024
  TANDEM_GEMM_TUNE=off dec q3-off-$r $Q 64,128,256 1024
done
grep -E "on the model's matrices" $L/decode-q3-1.log | cut -c1-200
for r in 1 2; do
  eng nano-$r $NANO; kinds nano-$r
  TANDEM_GEMM_TUNE=off eng nano-off-$r $NANO; kinds nano-off-$r
done
grep -iE "captur|graphs" $L/engine-nano-1.log $L/engine-nano-off-1.log | cut -c1-200
finish
