#!/usr/bin/env bash
# How many CTAs per SM the context-split rule aims at (TANDEM_SPLIT_CTAS_PER_SM, default 2), with
# the small-tile decode kernel: Qwen3-0.6B decode steps with contexts of 100-2048 positions, the
# 8B shape, and the nano-vllm workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
summ() { grep -E "decode .* step" "$1" | grep -v 16-row | sed -E 's/^\[[^]]*\] //' | cut -c1-105; }
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for n in 2 4 1 8; do export TANDEM_SPLIT_CTAS_PER_SM=$n
  timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 8,32,64,128 100-2048 > $L/decode-qwen3-c$n.log 2>&1; echo "== qwen3 ctas/SM $n"; summ $L/decode-qwen3-c$n.log
  timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,16 1024 > $L/decode-8b-c$n.log 2>&1; echo "== 8b ctas/SM $n"; summ $L/decode-8b-c$n.log
done
for i in 1 2; do for n in 2 4; do
  f=$L/engine-c$n-$i.log
  TANDEM_SPLIT_CTAS_PER_SM=$n timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine ctas/SM $n $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
