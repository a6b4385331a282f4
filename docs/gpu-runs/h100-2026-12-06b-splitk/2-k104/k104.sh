#!/usr/bin/env bash
# One H100: why nano-vllm's workload's decode steps of 129-256 rows reach ~80 % of their bound
# while bench-decode's at 192 sequences over contexts 100-1,500 reach ~87 %. Where the blocks lie:
# bench-decode with each sequence's blocks in one run, striped across the batch (as blocks
# taken one a step lie), or scattered over the pool (TANDEM_BENCH_BLOCKS); the workload with
# larger blocks and a smaller pool. And the split-k rule of this tree (4 slices up to 64 rows,
# 2 up to 128, products of at most 16 MiB) against none, on Qwen3 steps and the workload.
source scripts/gpu/session.sh
for r in 1 2; do
  for o in runs striped scattered; do TANDEM_BENCH_BLOCKS=$o dec q3-$o-$r $Q 128,192,256 100-1500; done
done
for r in 1 2; do
  dec q3-auto-$r $Q 48,64,96,128,192 1024
  TANDEM_SPLIT_K=off dec q3-off-$r $Q 48,64,96,128,192 1024
done
for r in 1 2; do
  eng nano-$r $NANO; kinds nano-$r
  TANDEM_SPLIT_K=off eng nano-off-$r $NANO; kinds nano-off-$r
done
eng nano-bs32 $NANO --block-size 32; kinds nano-bs32
eng nano-bs64 $NANO --block-size 64; kinds nano-bs64
eng nano-pool30 $NANO --gpu-memory-utilization 0.3; kinds nano-pool30
grep -E "^HBM|^peak KV" $L/engine-nano-1.log $L/engine-nano-pool30.log | cut -c1-200
finish
