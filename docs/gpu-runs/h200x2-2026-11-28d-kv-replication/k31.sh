#!/usr/bin/env bash
# KV heads replicated when a tensor-parallel group is larger than their count (two NVIDIA H200):
# TP=2 against one GPU on a tiny Llama cut to one KV head and on the Llama-3-8B shape with one KV
# head (random weights), the whole tp.sh check, and TP=1 prefill -> TP=2 decode on the one-KV-head
# model against colocated TP=2.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
python3 scripts/gpu/one_kv_head.py tests/data/tiny-llama /tmp/mqa
python3 -c "import json; c=json.load(open('.gpu/bin/configs/llama-3-8b.json')); c['num_key_value_heads']=1; c['num_hidden_layers']=8; json.dump(c, open('/tmp/l8b-one-kv.json','w'))"
for m in /tmp/mqa /tmp/l8b-one-kv.json; do timeout 200 $g tp-check $m 2 8 64 > $L/tp-check-$(basename $m).log 2>&1; echo "tp-check $m rc=$?"; grep -vE "^\s*$" $L/tp-check-$(basename $m).log | tail -4 | cut -c1-220; done
OUT=$L bash scripts/gpu/tp.sh check > $L/tp-sh-check.log 2>&1; echo "tp.sh check rc=$?"; grep -E "^== |tokens|equal|FAIL|margin" $L/tp-sh-check.log | cut -c1-200 | head -40
TP_MODEL=/tmp/mqa OUT=$L timeout 300 bash scripts/gpu/disagg.sh "" .gpu/tandem/tandem tp > $L/disagg-tp-mqa.log 2>&1; echo "disagg tp (one KV head) rc=$?"; tail -12 $L/disagg-tp-mqa.log | cut -c1-200
tar czf $OUT/logs.tgz -C $L .
