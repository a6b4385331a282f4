#!/usr/bin/env bash
# The 8B shape at batch 64 and 256 with the split rule aiming at 2, 4 and 6 CTAs per SM.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
summ() { grep -E "decode .* step" "$1" | grep -v 16-row | sed -E 's/^\[[^]]*\] //' | cut -c1-105; grep -E "eager" "$1" | grep -oE "attention [0-9.]+ ms" | tr '\n' ' '; echo; }
for n in 2 4 6 2 4; do
  TANDEM_SPLIT_CTAS_PER_SM=$n timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-c$n.log 2>&1; echo "== 8b ctas/SM $n"; summ $L/decode-8b-c$n.log
done
TANDEM_SPLIT_CTAS_PER_SM=4 TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64 1024 > $L/decode-8b-copy-c4.log 2>&1; echo "== copies only, 4/SM"; summ $L/decode-8b-copy-c4.log
tar czf $OUT/logs.tgz -C $L .
