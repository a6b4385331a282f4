#!/usr/bin/env bash
# Where a 16k-token prefill pass of the Qwen3-0.6B shape goes.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for s in "16 1024" "32 512" "4 2048"; do set -- $s; timeout 150 $g bench-prefill .gpu/bin/configs/qwen3-0.6b.json $1 $2 > $L/prefill-qwen3-$1x$2.log 2>&1; echo "== $1 x $2 rc=$?"; sed -E 's/^\[[^]]*\] //' $L/prefill-qwen3-$1x$2.log | cut -c1-700; done
tar czf $OUT/logs.tgz -C $L .
