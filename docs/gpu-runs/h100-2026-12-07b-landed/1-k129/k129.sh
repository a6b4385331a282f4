#!/usr/bin/env bash
# The landed tree's binaries (built at 6b0629e1: wide kernels removed, finished requests'
# outputs handed over at once by default) with no variable set: the checks, decode steps of the
# Qwen3-0.6B and Llama-3-8B shapes, nano-vllm's workload twice, served rounds on every core and
# on cores 0-3. Then the attention split rule at the 8B shape's 64 and 256 sequences with 4 and
# 8 CTAs an SM aimed at instead of 2 (TANDEM_SPLIT_CTAS_PER_SM).
source scripts/gpu/session.sh
chk bf16
chk f16
dec q3 $Q 16,64,128,256 1024
dec l8b $E 64,256 1024
for r in 1 2; do eng nano-$r $NANO; kinds nano-$r; done
for r in 1 2 3; do served 1; mv $L/served $L/served-all-$r; mv $L/peer.log $L/served-all-$r/; done
for r in 1 2; do
  taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"
  mv $L/served $L/served-4cores-$r 2>/dev/null; mv $L/peer.log $L/served-4cores-$r/ 2>/dev/null
done
for s in 4 8; do TANDEM_SPLIT_CTAS_PER_SM=$s dec l8b-ctas$s $E 64,256 1024; done
dec l8b-again $E 64,256 1024
finish
