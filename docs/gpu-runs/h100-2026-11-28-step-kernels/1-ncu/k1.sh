#!/usr/bin/env bash
# Where a decode step's GPU time goes, kernel by kernel (ncu, one step's graph replays).
set -u
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
k() { local n="$1"; shift; timeout 200 python3 scripts/gpu/step_kernels.py --bin .gpu/bin/tandem-gpu "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; head -30 $L/$n.log | cut -c1-120; }
k qwen3-b64 .gpu/bin/configs/qwen3-0.6b.json 64 100-2048
k qwen3-b256 .gpu/bin/configs/qwen3-0.6b.json 256 100-2048
k qwen3-b32 .gpu/bin/configs/qwen3-0.6b.json 32 100-2048
k qwen3-b1 .gpu/bin/configs/qwen3-0.6b.json 1 100-2048
k llama8b-b64 .gpu/bin/configs/llama-3-8b.json 64 1024
k smollm2-b256 .gpu/pack/smollm2-135m-shape.json 256 100-300
tar czf $OUT/logs.tgz -C $L .
