#!/usr/bin/env bash
# One H200: the one-token RoPE kernels restored as they were, the four-token one for heads up to
# 64 wide in prefills; against the tree before this stop (old-tandem-gpu, built at 4176588).
set -u
g=.gpu/bin/tandem-gpu; o=.gpu/pack/old-tandem-gpu; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
for d in bf16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log)"; done
for r in 1; do for c in "S $S 76 108" "Q $Q 76 108" "Q $Q 16 1024" "B $B 4 2048"; do set -- $c
  for v in new old; do b=$g; [ $v = old ] && b=$o
    timeout 120 $b bench-prefill $2 $3 $4 > $L/prefill-$1-$3x$4-$v-r$r.log 2>&1
    echo "r$r $1 $3x$4 $v: rope stage $(grep -m1 -oE 'qk norm, rope, kv store [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}') ms; eager stages $(grep -m1 -oE 'eager stages, [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}'), logits to host $(grep -m1 -oE 'logits to host [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}')"
  done; done; done
for r in 1 2; do for c in "S $S 100-300" "Q $Q 100-2048"; do set -- $c
  for v in new old; do b=$g; [ $v = old ] && b=$o
    timeout 150 $b bench-decode $2 1,64,256 $3 > $L/decode-$1-$v-r$r.log 2>&1
    echo "r$r decode $1 $v: $(grep -E 'decode .* step' $L/decode-$1-$v-r$r.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*/b\1 \2/' | tr '\n' ' ')"
  done; done; done
t=.gpu/tandem/tandem
timeout 120 $t bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 1024 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served.log 2>&1
echo "served workload: $(grep -E 'throughput|digest' $L/engine-served.log | tr -s ' ' | cut -c1-100 | tr '\n' ';')"
timeout 200 $t bench engine --device cuda --load-format dummy --model $Q --workload-file .gpu/pack/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano.log 2>&1
echo "nano-vllm: $(grep -E 'throughput|digest|prefill phase' $L/engine-nano.log | tr -s ' ' | cut -c1-100 | tr '\n' ';')"
tar czf $OUT/logs.tgz -C $L .
