#!/usr/bin/env bash
# One H200: the RoPE kernels against the tree before this stop's change (old-tandem-gpu, built
# at 4176588): prefills' q/k norm + RoPE + KV store stage, and decode steps, alternating.
set -u
g=.gpu/bin/tandem-gpu; o=.gpu/pack/old-tandem-gpu; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log)"; done
for m in tiny-llama tiny-qwen3; do timeout 120 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(tail -1 $L/e2e-$m.log | cut -c1-100)"; done
for r in 1 2; do for c in "S $S 76 108" "S $S 8 1024" "Q $Q 76 108" "Q $Q 16 1024" "B $B 4 2048"; do set -- $c
  for v in new old; do b=$g; [ $v = old ] && b=$o
    timeout 120 $b bench-prefill $2 $3 $4 > $L/prefill-$1-$3x$4-$v-r$r.log 2>&1
    echo "r$r $1 $3x$4 $v: rope stage $(grep -m1 -oE 'qk norm, rope, kv store [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}') ms; eager stages $(grep -m1 -oE 'eager stages, [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}'), logits to host $(grep -m1 -oE 'logits to host [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}')"
  done; done; done
for r in 1 2; do for c in "S $S 100-300" "Q $Q 100-2048"; do set -- $c
  for v in new old; do b=$g; [ $v = old ] && b=$o
    timeout 150 $b bench-decode $2 1,64,256 $3 > $L/decode-$1-$v-r$r.log 2>&1
    echo "r$r decode $1 $v: $(grep -E 'decode .* step' $L/decode-$1-$v-r$r.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*/b\1 \2/' | tr '\n' ' ')"
  done; done; done
tar czf $OUT/logs.tgz -C $L .
