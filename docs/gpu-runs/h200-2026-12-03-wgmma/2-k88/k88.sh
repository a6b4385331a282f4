#!/usr/bin/env bash
# One H200: where the Qwen3 step at 64 sequences goes, kernel by kernel under Nsight Compute,
# with products of up to 64 rows on the stream kernels (wgmma) and with every product on
# cuBLAS; then the stream kernel of 64 rows itself (throughput, memory, warp stalls).
source scripts/gpu/session.sh
P="python3 scripts/gpu/step_kernels.py --bin $g"
TANDEM_STREAM_GEMM_MAX_ROWS=64 timeout 150 $P $Q 64 100-2048 > $L/step-Q64-stream.log 2>&1; echo "$(el) step stream rc=$?"; cat $L/step-Q64-stream.log | cut -c1-110
TANDEM_STREAM_GEMM=off timeout 150 $P $Q 64 100-2048 > $L/step-Q64-cublas.log 2>&1; echo "$(el) step cuBLAS rc=$?"; cat $L/step-Q64-cublas.log | cut -c1-110
N=/usr/local/cuda/bin/ncu
TANDEM_STREAM_GEMM_MAX_ROWS=64 timeout 200 $N --profile-from-start off --clock-control none --cache-control none \
  -k regex:gemm_stream64 -c 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section LaunchStats --section Occupancy --section SchedulerStats $g step $Q 64 100-2048 > $L/ncu-stream64.log 2>&1
echo "$(el) ncu gemm_stream64 rc=$?"
grep -E "gemm_stream64|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issued Warp|Achieved Occupancy|Grid Size|Cluster|Registers|Shared Memory Config|No Eligible|One or More|Active Warps|Block Limit|Theoretical Occ" $L/ncu-stream64.log | head -90 | cut -c1-130
finish
