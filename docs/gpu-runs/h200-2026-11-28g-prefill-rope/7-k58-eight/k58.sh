#!/usr/bin/env bash
# One H200: qkv_rope_store_p1 (heads up to 64 wide) taking eight tokens a warp instead of four
# (k54: 1.06 ms of the SmolLM2 shape's 76 x 108 prefill), one a warp beside for comparison.
set -u
g=.gpu/bin/tandem-gpu; C=.gpu/bin/configs; S=$C/smollm2-135m-shape.json
L=/tmp/logs; mkdir -p $L
timeout 200 $g check bf16 > $L/check-bf16.log 2>&1; echo "check bf16 rc=$? pass=$(grep -c PASS $L/check-bf16.log) fail=$(grep -c FAIL $L/check-bf16.log)"; grep -E "hd 64, 8 token" $L/check-bf16.log | cut -c1-130
for r in 1 2; do for c in "76 108" "8 1024" "16 256" "4 256"; do set -- $c
  for v in new one; do e=X=1; [ $v = one ] && e=TANDEM_ROPE_MANY=1000000000
    timeout 120 env $e $g bench-prefill $S $1 $2 > $L/prefill-$1x$2-$v-r$r.log 2>&1
    echo "r$r $1x$2 $v: $(grep -m1 'prefill kernel)' $L/prefill-$1x$2-$v-r$r.log | grep -oE '[0-9.]+ ms' | head -1) rope stage $(grep -m1 -oE 'qk norm, rope, kv store [0-9.]+ ms' $L/prefill-$1x$2-$v-r$r.log | awk '{print $(NF-1)}')"
  done; done; done
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none --section SpeedOfLight -k regex:qkv_rope_store --launch-skip 40 --launch-count 1 $g bench-prefill $S 76 108 > $L/ncu-rope.txt 2>&1
echo "ncu rope 8 a warp: $(grep -E '^\s+(Duration|DRAM Throughput|Compute \(SM\) Throughput)' $L/ncu-rope.txt | tr -s ' ' | tr '\n' ';')"
tar czf $OUT/logs.tgz -C $L .
