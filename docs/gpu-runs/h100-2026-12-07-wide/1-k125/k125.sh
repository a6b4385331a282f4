#!/usr/bin/env bash
# First run of the wide stream kernels (gemm_wide64/128/192/256: two warpgroups, 128 columns a
# CTA, products of 33-256 rows): the checks; bench-gemm of Qwen3-0.6B's decode products with
# them against cuBLAS (and the pipeline without LAG, and half the fill); decode steps and
# nano-vllm's workload with them (TANDEM_WIDE_GEMM_MAX_ROWS=256) against without (default 0);
# the 8B shape at 64 with them on its large matrices.
source scripts/gpu/session.sh
chk bf16
TANDEM_WIDE_GEMM_MAX_ROWS=256 gem q3-wide $Q 48,64,96,128,192,256
TANDEM_WIDE_GEMM_MAX_ROWS=256 TANDEM_CUDA_DEFINES=TANDEM_GS_WIDE_LAG0 gem q3-wide-lag0 $Q 128,256
TANDEM_WIDE_GEMM_MAX_ROWS=256 TANDEM_WIDE_GEMM_FILL=0.5 gem q3-wide-fill05 $Q 128,256
for r in 1 2; do
  dec q3-off-$r $Q 64,128,192,256 1024
  TANDEM_WIDE_GEMM_MAX_ROWS=256 dec q3-wide-$r $Q 64,128,192,256 1024
done
for r in 1 2; do
  eng nano-off-$r $NANO; kinds nano-off-$r
  TANDEM_WIDE_GEMM_MAX_ROWS=256 eng nano-wide-$r $NANO; kinds nano-wide-$r
done
dec l8b-off $E 64 1024
TANDEM_WIDE_GEMM_MAX_ROWS=256 TANDEM_WIDE_GEMM_MAX_MB=1024 dec l8b-wide $E 64 1024
finish
