#!/usr/bin/env bash
# One H100, after the review mend (one RMSNorm helper for every residual state, the tuning's
# gemv/stream skip inside Gpu::tune_gemm, sample_rows' second pass only for filtered rows): the
# checks, Qwen3 and 8B steps at 64 sequences, nano-vllm's workload.
source scripts/gpu/session.sh
chk bf16
dec q3 $Q 64,128 1024
dec l8b $E 64 1024
eng nano $NANO; kinds nano
finish
