#!/usr/bin/env bash
# (1) A decode step as two independent halves on two streams (bench-lanes), one H200.
# (2) TP=4 on four H200s: tiny models (2 KV heads: each replicated on two ranks), a one-KV-head
#     tiny Llama (replicated on four), the Llama-3-8B shape (8 KV heads, 2 a rank); 70B decode TP=4.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
lanes() { timeout 150 $g bench-lanes cuda/configs/$1 $2 $3 > $L/lanes-$1-$3.log 2>&1; echo "lanes $1 rc=$?"; grep -E "decode|rror" $L/lanes-$1-$3.log | cut -c1-230; }
lanes qwen3-0.6b.json 16,64,256 100-2048
cp docs/gpu-runs/h100-2026-11-28-step-kernels/1-ncu/smollm2-135m-shape.json cuda/configs/ 2>/dev/null; lanes smollm2-135m-shape.json 16,64,256 100-300
lanes llama-3-8b.json 16,64,256 1024
n=$(nvidia-smi -L | wc -l)
if [ "$n" -ge 4 ]; then
  python3 scripts/gpu/one_kv_head.py tests/data/tiny-llama /tmp/mqa > /dev/null
  for m in tests/data/tiny-llama tests/data/tiny-qwen3 tests/data/tiny-phi3 /tmp/mqa .gpu/bin/configs/llama-3-8b.json; do
    timeout 240 $g tp-check $m 4 8 64 > $L/tp4-check-$(basename $m).log 2>&1; echo "tp-check TP=4 $m rc=$?"; grep -vE "^\s*$" $L/tp4-check-$(basename $m).log | tail -3 | cut -c1-220
  done
  timeout 500 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 4 > $L/tp4-decode-70b.log 2>&1; echo "decode 70b TP=4 rc=$?"; grep -E "limit:|decode llama|all-reduce" $L/tp4-decode-70b.log | cut -c1-230
fi
tar czf $OUT/logs.tgz -C $L .
