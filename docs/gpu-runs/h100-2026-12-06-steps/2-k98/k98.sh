#!/usr/bin/env bash
# One H100: steps with prompt chunks queued like decode steps (they ran synchronously: their logits
# rows are not the batch's first rows), nano-vllm's workload twice with the steps by kind; then
# knobs for decode steps of 16-128 sequences: the context-split rule's CTAs per SM
# (TANDEM_SPLIT_CTAS_PER_SM 2 = default, 4, 8) on Qwen3-0.6B and Llama-3-8B shapes, products of
# 64 rows on the stream kernels (TANDEM_STREAM_GEMM_MAX_ROWS=64, up to 128 MB), and the workload
# under the split knobs.
source scripts/gpu/session.sh
for r in 1 2; do
  eng nano-$r $NANO --steps-out $L/steps-nano-$r.jsonl
  grep -E "^HBM|^device|^launch|^prefill phase" $L/engine-nano-$r.log | cut -c1-250
  grep -A7 "^steps by kind" $L/engine-nano-$r.log | tail -n +2 | cut -c1-250
done
cp $L/steps-nano-1.jsonl $OUT/
for c in 2 4 8; do
  TANDEM_SPLIT_CTAS_PER_SM=$c dec q3-c$c $Q 16,32,64,128 1024
done
for c in 2 4 8; do
  TANDEM_SPLIT_CTAS_PER_SM=$c dec l8b-c$c $E 32,64 1024
done
TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_STREAM_GEMM_MAX_MB=128 dec l8b-gs64 $E 32,64 1024
TANDEM_STREAM_GEMM_MAX_ROWS=64 dec q3-gs64 $Q 64 1024
gem l8b $E 64
for c in 4 8; do
  TANDEM_SPLIT_CTAS_PER_SM=$c eng nano-c$c $NANO
  grep -A7 "^steps by kind" $L/engine-nano-c$c.log | tail -n +2 | cut -c1-250
done
finish
