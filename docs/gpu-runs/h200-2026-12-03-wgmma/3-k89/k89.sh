#!/usr/bin/env bash
# One H200: the stream GEMMs in CTAs of 128 weight rows (8 warps, two warpgroups sharing each
# stage of A: gemm_stream*w) against 64 (4 warps), wgmma both: the checks (both widths), bench-gemm
# of the Qwen3 shape, the decode step of the three shapes with products of up to 64 rows on the
# stream kernels and the 128-row CTAs from tiles of 64 rows (default), 16, or never; nano-vllm.
source scripts/gpu/session.sh
chk bf16
chk f16
export TANDEM_STREAM_GEMM_MAX_ROWS=64
TANDEM_STREAM_GEMM_WIDE_ROWS=8 gem Q-wide $Q 16,32,64
TANDEM_STREAM_GEMM_WIDE_ROWS=999 gem Q-narrow $Q 16,32,64
for r in 1 2; do
  dec Q-w64-r$r $Q 8,16,32,48,64 100-2048
  TANDEM_STREAM_GEMM_WIDE_ROWS=16 dec Q-w16-r$r $Q 8,16,32,48,64 100-2048
  TANDEM_STREAM_GEMM_WIDE_ROWS=999 dec Q-narrow-r$r $Q 8,16,32,48,64 100-2048
done
TANDEM_STREAM_GEMM_FILL=2 dec Q-w64-fill2 $Q 32,64 100-2048
dec S-w64 $S 16,32,64 100-300
TANDEM_STREAM_GEMM_WIDE_ROWS=16 dec S-w16 $S 16,32,64 100-300
TANDEM_STREAM_GEMM_WIDE_ROWS=999 dec S-narrow $S 16,32,64 100-300
dec E-w64 $E 16,32,64 1024
TANDEM_STREAM_GEMM_WIDE_ROWS=16 dec E-w16 $E 16,32,64 1024
eng nano-max64 $NANO
unset TANDEM_STREAM_GEMM_MAX_ROWS
eng nano-default $NANO
finish
