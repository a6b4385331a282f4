#!/usr/bin/env bash
# Why the wide stream kernels lose (k125): gemm_wide128 inside Qwen3-0.6B's decode step at 128
# sequences under Nsight Compute (throughput, memory, warp stalls, launch and occupancy); then
# served rounds (SmolLM2 shape) with the defaults
# against finished requests' outputs handed over at once (TANDEM_DISPATCH_FINISHED_AT_ONCE=1).
source scripts/gpu/session.sh
N=/usr/local/cuda/bin/ncu
TANDEM_WIDE_GEMM_MAX_ROWS=256 timeout 100 $N --profile-from-start off --clock-control none --cache-control none \
  -k regex:gemm_wide128 -c 3 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section LaunchStats --section Occupancy --section SchedulerStats $g step $Q 128 1024 > $L/ncu-wide128.log 2>&1
echo "$(el) ncu gemm_wide128 rc=$?"
grep -E "gemm_wide128|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issued Warp|Achieved Occupancy|Grid Size|Cluster|Registers|Shared Memory Config|No Eligible|One or More|Active Warps|Block Limit|Theoretical Occ" $L/ncu-wide128.log | head -60 | cut -c1-130
for r in 1 2; do
  served 1; mv $L/served $L/served-default-$r; mv $L/peer.log $L/peer-default-$r.log
  TANDEM_DISPATCH_FINISHED_AT_ONCE=1 served 1; mv $L/served $L/served-atonce-$r; mv $L/peer.log $L/peer-atonce-$r.log
done
finish
