#!/usr/bin/env bash
# One H200: the stream GEMMs on the warpgroup MMA (sm_90a: wgmma reading W and A from the
# stages) against the same kernels on mma.sync (TANDEM_GS_MMA_SYNC), in one run: the checks in
# both 16-bit types, bench-gemm of the Qwen3 shape at 2-64 rows, the decode step of the three
# shapes with products of up to 64 rows on the stream kernels (bench-decode prints the
# all-cuBLAS step beside each), nano-vllm's workload.
source scripts/gpu/session.sh
chk bf16
chk f16
M=TANDEM_GS_MMA_SYNC
TANDEM_STREAM_GEMM_MAX_ROWS=64 gem Q-wgmma $Q 2,8,16,32,64
TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_CUDA_DEFINES=$M gem Q-sync $Q 2,8,16,32,64
for r in 1 2; do
  TANDEM_STREAM_GEMM_MAX_ROWS=64 dec Q-wgmma-r$r $Q 2,8,16,32,64 100-2048
  TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_CUDA_DEFINES=$M dec Q-sync-r$r $Q 2,8,16,32,64 100-2048
done
TANDEM_STREAM_GEMM_MAX_ROWS=64 dec S-wgmma $S 2,16,32,64 100-300
TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_CUDA_DEFINES=$M dec S-sync $S 2,16,32,64 100-300
TANDEM_STREAM_GEMM_MAX_ROWS=64 dec E-wgmma $E 2,16,32,64 1024
TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_CUDA_DEFINES=$M dec E-sync $E 2,16,32,64 1024
TANDEM_STREAM_GEMM_MAX_ROWS=64 eng nano-wgmma64 $NANO
eng nano-default $NANO
TANDEM_CUDA_DEFINES=$M eng nano-sync $NANO
echo "$(el) done"
