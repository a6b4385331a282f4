#!/usr/bin/env bash
# Two-shot peer all-reduce, columns owned by ranks (four NVIDIA H200): TP=4 greedy checks with
# the default rule and with two shots at every size; the 70B shape's decode at TP=4 with two
# shots always and one shot always (where the rule's crossover lies), and NCCL beside them.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
python3 scripts/gpu/one_kv_head.py tests/data/tiny-llama /tmp/mqa > /dev/null
for mode in default peer-two-shot; do
for m in tests/data/tiny-llama tests/data/tiny-qwen3 /tmp/mqa .gpu/bin/configs/llama-3-8b.json; do
  timeout 240 env TANDEM_TP_ALL_REDUCE=$mode $g tp-check $m 4 8 64 > $L/tp4-check-$mode-$(basename $m).log 2>&1; echo "tp-check TP=4 $mode $m rc=$?"; grep -vE "^\s*$" $L/tp4-check-$mode-$(basename $m).log | tail -1 | cut -c1-220
done; done
dec() { timeout 400 env $2 $g bench-decode .gpu/bin/configs/llama-3-70b.json $3 1024 $4 > $L/decode-70b-$1.log 2>&1; echo "== $1 rc=$?"; grep -E "decode llama|all-reduce" $L/decode-70b-$1.log | cut -c1-200; }
dec tp4-two-shot TANDEM_TP_ALL_REDUCE=peer-two-shot 1,4,16,32,64,256 4
dec tp4-one-shot TANDEM_TP_ALL_REDUCE=peer-one-shot 1,4,16,32,64,256 4
dec tp4-nccl TANDEM_TP_ALL_REDUCE=nccl 16,64,256 4
tar czf $OUT/logs.tgz -C $L .
