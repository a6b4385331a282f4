#!/usr/bin/env bash
# Final checks of this stop on four NVIDIA H200: scripts/gpu/tp.sh check (TP=2 and TP=4),
# the 70B shape's decode at TP=2 and prefill at TP=2 with the defaults, TP=1 prefill -> TP=2
# decode, and `bench engine` at TP=2 with its KV pool sized from memory (the peer buffers of
# 8192 rows beside it).
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
OUT=$L bash scripts/gpu/tp.sh check > $L/tp-sh-check.log 2>&1; echo "tp.sh check rc=$?"; grep -E "^== |PASS|FAIL" $L/tp-sh-check.log | grep -v "sequence" | cut -c1-180
timeout 400 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 > $L/decode-70b-tp2.log 2>&1; echo "decode rc=$?"; grep -E "decode llama|all-reduce" $L/decode-70b-tp2.log | cut -c1-200
timeout 300 $g bench-prefill .gpu/bin/configs/llama-3-70b.json 4 2048 2 > $L/prefill-70b-tp2.log 2>&1; echo "prefill rc=$?"; grep -E "prefill llama" $L/prefill-70b-tp2.log | cut -c1-200
OUT=$L timeout 300 bash scripts/gpu/tp.sh disagg > $L/disagg.log 2>&1; echo "disagg rc=$?"; tail -8 $L/disagg.log | cut -c1-200
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null
timeout 300 .gpu/tandem/tandem bench engine --device cuda --load-format dummy --model .gpu/bin/configs/llama-3-8b.json --workload-file /tmp/w.json --temperature 0.6 --tensor-parallel-size 2 > $L/engine-8b-tp2-defaults.log 2>&1; echo "engine rc=$?"; grep -E "output tok/s|digest|KV" $L/engine-8b-tp2-defaults.log
tar czf $OUT/logs.tgz -C $L .
