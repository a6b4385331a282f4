#!/usr/bin/env bash
# One H200: the prefill kernel's warps a CTA (TANDEM_PF_WARPS 2 / 4 / 8) on batches of short
# prompts (76 x 108) against long ones, SmolLM2-135M shape and Qwen3-0.6B, two rounds.
set -u
g=.gpu/bin/tandem-gpu; C=.gpu/bin/configs; S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
for r in 1 2; do for c in "S $S 76 108" "Q $Q 76 108" "Q $Q 16 1024" "S $S 256 32"; do set -- $c
  for w in 4 2 8; do
    timeout 120 env TANDEM_PF_WARPS=$w $g bench-prefill $2 $3 $4 > $L/prefill-$1-$3x$4-w$w-r$r.log 2>&1
    echo "r$r $1 $3x$4 warps $w: $(grep -m1 'prefill kernel)' $L/prefill-$1-$3x$4-w$w-r$r.log | grep -oE '[0-9.]+ ms' | head -1) attention stage $(grep -m1 -oE 'attention \(prefill kernel\) [0-9.]+ ms' $L/prefill-$1-$3x$4-w$w-r$r.log | awk '{print $(NF-1)}') small-tile $(grep -m1 'small-tile' $L/prefill-$1-$3x$4-w$w-r$r.log | grep -oE '[0-9.]+ ms' | head -1)"
  done; done; done
tar czf $OUT/logs.tgz -C $L .
