#!/usr/bin/env bash
# Two-shot peer all-reduce for groups of more than two (four NVIDIA H200): TP=4 greedy checks
# against one GPU (same counts as the one-shot run k32 expected: the sums are the same bits),
# the 70B shape's decode at TP=4 two-shot / one-shot / NCCL, and TP=2 unchanged.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
python3 scripts/gpu/one_kv_head.py tests/data/tiny-llama /tmp/mqa > /dev/null
for m in tests/data/tiny-llama tests/data/tiny-qwen3 /tmp/mqa .gpu/bin/configs/llama-3-8b.json; do
  timeout 240 $g tp-check $m 4 8 64 > $L/tp4-check-$(basename $m).log 2>&1; echo "tp-check TP=4 $m rc=$?"; grep -vE "^\s*$" $L/tp4-check-$(basename $m).log | tail -1 | cut -c1-220
done
dec() { timeout 400 env $2 $g bench-decode .gpu/bin/configs/llama-3-70b.json $3 1024 $4 > $L/decode-70b-$1.log 2>&1; echo "== $1 rc=$?"; grep -E "decode llama|all-reduce" $L/decode-70b-$1.log | cut -c1-200; }
dec tp4-two-shot X=1 1,16,64,256 4
dec tp4-one-shot TANDEM_TP_ALL_REDUCE=peer-one-shot 16,64,256 4
dec tp4-nccl TANDEM_TP_ALL_REDUCE=nccl 64,256 4
dec tp2 X=1 1,64,256 2
tar czf $OUT/logs.tgz -C $L .
