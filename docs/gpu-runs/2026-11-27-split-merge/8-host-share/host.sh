#!/usr/bin/env bash
# How much of an engine decode step is not the graph: 256 sequences of 1024 + 128 tokens through
# bench engine, against the graph replay of the same shape in bench-decode.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee $L/smi.log
for n in 256 64; do
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --num-prompts $n --input-len 1024 --min-input-len 1024 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 16384 --temperature 0.6 > $L/engine-$n.log 2>&1
  echo "engine $n: $(grep -E 'decode phase|steps|per step' $L/engine-$n.log | tr -s ' ' | tr '\n' ';')"
done
timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 64,256 1088 > $L/decode-1088.log 2>&1; grep -E "decode .* step" $L/decode-1088.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110
timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 64,256 1024 > $L/decode-1024.log 2>&1; grep -E "decode .* step" $L/decode-1024.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110
tar czf $OUT/logs.tgz -C $L .
