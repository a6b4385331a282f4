#!/usr/bin/env bash
# Graph census and node cost; replays alone vs back to back; decode-attention knobs on the 8B shape.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
timeout 60 $g bench-nodes > $L/nodes.log 2>&1; sed -E 's/^\[[^]]*\] //' $L/nodes.log
dec() { local n="$1"; shift; timeout 150 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|back to back|graph:" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-900; }
dec qwen3 X=1 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,64,256 100-2048
dec l8b X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024
dq() { local n="$1"; shift; timeout 150 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$? $(grep -E 'decode .* step|back to back' $L/$n.log | sed -E 's/^\[[^]]*\] //' | grep -oE 'batch +[0-9]+|step [0-9.]+ ms|back: [0-9.]+ ms' | tr '\n' ' ')"; }
dq l8b-split3 TANDEM_SPLIT_CTAS_PER_SM=3 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-split4 TANDEM_SPLIT_CTAS_PER_SM=4 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-split6 TANDEM_SPLIT_CTAS_PER_SM=6 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-warps2 TANDEM_DEC_WARPS=2 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-stages3 TANDEM_MMA_STAGES=3 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-round TANDEM_CUDA_DEFINES=TANDEM_DEC_ROUND $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
dq l8b-default X=1 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024
tar czf $OUT/logs.tgz -C $L .
