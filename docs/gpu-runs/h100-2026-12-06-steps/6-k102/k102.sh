#!/usr/bin/env bash
# One H100, the tree of this stop: what the next levers are worth. Qwen3-0.6B's prefill of 16 x
# 1,024 by stage; its decode products at 64 / 128 / 256 rows on cuBLAS and Tandem's kernels; its
# decode step at 128 and 192 sequences over contexts of 100-1,500 (the workload's middle), by stage.
source scripts/gpu/session.sh
timeout 200 $g bench-prefill $Q 16 1024 > $L/prefill-q3.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill qwen3|eager stages" $L/prefill-q3.log | cut -c1-420
gem q3 $Q 64,128,256
timeout 200 $g bench-decode $Q 128,192 100-1500 > $L/decode-q3-mid.log 2>&1
echo "$(el) decode rc=$?"; grep -E "decode qwen3|eager stages|graph:" $L/decode-q3-mid.log | cut -c1-420
finish
