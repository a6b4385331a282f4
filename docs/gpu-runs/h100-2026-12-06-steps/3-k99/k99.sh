#!/usr/bin/env bash
# One H100, same machine for every A/B: (1) steps with prompt chunks queued (the default now)
# against synchronous (TANDEM_SYNC_PROMPT_STEPS=1, as before), nano-vllm's workload alternating;
# (2) the fused decode kernel launched as a programmatic dependent of the q|k|v GEMM, issuing its
# first page copies before it waits (TANDEM_CUDA_DEFINES=TANDEM_DEC_EARLY_COPIES, the rope
# kernels out of TANDEM_PDL_SKIP) against the default (plain launch, wait at entry).
source scripts/gpu/session.sh
SKIP=attention,attention_decode,attention_mma64,attention_mma128,attention_dec64,attention_dec128,attention_prefill64,attention_prefill128
kinds() { grep -A7 "^steps by kind" $L/engine-$1.log | grep -E "with prompts|129-256" | cut -c1-200; }
for r in 1 2; do
  eng nano-q$r $NANO; kinds nano-q$r
  TANDEM_SYNC_PROMPT_STEPS=1 eng nano-s$r $NANO; kinds nano-s$r
done
for r in 1 2; do
  dec q3-$r $Q 16,64,128,256 1024
  TANDEM_CUDA_DEFINES=TANDEM_DEC_EARLY_COPIES TANDEM_PDL_SKIP=$SKIP dec q3-early-$r $Q 16,64,128,256 1024
done
dec l8b $E 16,64,256 1024
TANDEM_CUDA_DEFINES=TANDEM_DEC_EARLY_COPIES TANDEM_PDL_SKIP=$SKIP dec l8b-early $E 16,64,256 1024
dec smol $S 16,64,256 100-300
TANDEM_CUDA_DEFINES=TANDEM_DEC_EARLY_COPIES TANDEM_PDL_SKIP=$SKIP dec smol-early $S 16,64,256 100-300
for r in 1 2; do
  TANDEM_CUDA_DEFINES=TANDEM_DEC_EARLY_COPIES TANDEM_PDL_SKIP=$SKIP eng nano-e$r $NANO; kinds nano-e$r
  eng nano-d$r $NANO; kinds nano-d$r
done
finish
