#!/usr/bin/env bash
# Groups of 8 query heads a KV head: the 16-row attention kernel from 256 (sequence, KV head)
# pairs on (four NVIDIA H200). The 70B shape's decode at TP=2 and TP=4 over batch sizes (the
# "16-row" line beside each is the 16-row kernel everywhere); tp-check of a 4-layer 70B shape
# with 64 sequences (the 16-row path) and 8 (the small-tile path).
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
for n in 8 64; do timeout 200 $g tp-check docs/gpu-runs/h200x4-2026-11-28e-two-shot/8-group8-rows16/l70b-4l.json 2 $n 16 > $L/tp2-check-70b-4l-$n.log 2>&1; echo "tp-check $n rc=$? $(tail -1 $L/tp2-check-70b-4l-$n.log | cut -c1-90)"; grep -h "parts" $L/tp2-check-70b-4l-$n.log | sed 's/.*margin is //' | sort -n | tail -1; done
timeout 300 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,16,32,64,128,256 1024 2 > $L/decode-70b-tp2.log 2>&1; echo "rc=$?"; grep -E "decode llama|16-row" $L/decode-70b-tp2.log | cut -c1-140
timeout 300 $g bench-decode .gpu/bin/configs/llama-3-70b.json 16,64,128,256 1024 4 > $L/decode-70b-tp4.log 2>&1; echo "rc=$?"; grep -E "decode llama|16-row" $L/decode-70b-tp4.log | cut -c1-140
tar czf $OUT/logs.tgz -C $L .
