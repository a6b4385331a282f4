#!/usr/bin/env bash
# The stream GEMM kernels with tiles of 128, 192 and 256 rows of A (the warpgroup MMA's N up to
# 256; one weight read a step, the gate|up product with its activation in one kernel, k cut
# inside a cluster) against cuBLAS (with split-k o/down) for decode steps of 33-256 sequences:
# TANDEM_STREAM_GEMM_MAX_ROWS=256 against the default 32. bench-decode replays the step both ways
# in one run (its "every product on cuBLAS" line is the default path above 32 rows); then
# nano-vllm's workload alternating default, wide, wide, default (digests must match within a
# variant; across variants the products' rounding differs).
source scripts/gpu/session.sh
W="env TANDEM_STREAM_GEMM_MAX_ROWS=256"
chk bf16
g0=$g; g="$W $g0"
dec q3-wide $Q 48,64,96,128,192,256 100-2000
t0=$t
for v in default wide wide default; do
  [ $v = wide ] && t="$W $t0" || t=$t0
  eng nano-$v $NANO; grep -E "^HBM" $L/engine-nano-$v.log | cut -c1-200; kinds nano-$v
done
t=$t0
gem q3-wide $Q 48,96,192,256
dec s2-wide $S 64,128,256 100-300
g=$g0
finish
