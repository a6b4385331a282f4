#!/usr/bin/env bash
# Same binaries as k129. The attention split rule's target, 2 CTAs an SM (default) against 4
# and 8 (TANDEM_SPLIT_CTAS_PER_SM): decode steps of the Qwen3-0.6B and Llama-3-8B shapes at
# equal contexts of 1,024 and (Qwen3) at contexts of 100-2,048, then nano-vllm's workload
# alternating 2 and 4.
source scripts/gpu/session.sh
for s in 2 4 8; do
  TANDEM_SPLIT_CTAS_PER_SM=$s dec q3-s$s $Q 16,32,48,64,96,128 1024
  TANDEM_SPLIT_CTAS_PER_SM=$s dec l8b-s$s $E 16,32,64,128 1024
  TANDEM_SPLIT_CTAS_PER_SM=$s dec q3v-s$s $Q 32,64,128 100-2048
done
for r in 1 2; do
  for s in 2 4; do TANDEM_SPLIT_CTAS_PER_SM=$s eng nano-s$s-$r $NANO; kinds nano-s$s-$r; done
done
finish
