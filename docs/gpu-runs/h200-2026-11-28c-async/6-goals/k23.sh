#!/usr/bin/env bash
# Issue 30's kernel goals on the H200 with this tree: the Llama-3-8B shape's decode step at batch
# 1/64/256 (context 1024) against the HBM roofline, prefill 4 x 2048 against the GEMM peak.
set -u
g=.gpu/bin/tandem-gpu; L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
timeout 250 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-l8b.log 2>&1; grep -E "limit:|decode llama|GEMMs' arithmetic" $L/decode-l8b.log | cut -c1-200
timeout 200 $g bench-prefill .gpu/bin/configs/llama-3-8b.json 4 2048 > $L/prefill-l8b.log 2>&1; grep -vE "^\s*$" $L/prefill-l8b.log | head -6 | cut -c1-250
timeout 200 $g bench-prefill .gpu/bin/configs/qwen3-0.6b.json 16 1024 > $L/prefill-qwen3.log 2>&1; grep -vE "^\s*$" $L/prefill-qwen3.log | head -4 | cut -c1-250
tar czf $OUT/logs.tgz -C $L .
