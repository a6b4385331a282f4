#!/usr/bin/env bash
# Projections cut along k, second try: rmsnorm_parts with every slice's load in flight at once, one
# row left to gemv. Decode steps with and without, then ncu per kernel at 16 sequences both ways.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
timeout 200 $g check bf16 > $L/check-bf16.log 2>&1; echo "check-bf16 rc=$? $(grep -c PASS $L/check-bf16.log) pass $(grep -c FAIL $L/check-bf16.log) fail"
bd() { local n="$1"; shift; timeout 200 env "$@" $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,2,8,16,32,64 100-2048 > $L/decode-$n.log 2>&1; echo "== decode-$n rc=$?"; grep -E "limit:|decode qwen3|whole" $L/decode-$n.log | cut -c16-250; }
bd default X=1
for v in cut whole; do
  e=X=1; [ $v = whole ] && e=TANDEM_CUT_K=off
  timeout 200 env $e python3 scripts/gpu/step_kernels.py --bin $g .gpu/bin/configs/qwen3-0.6b.json 16 100-2048 > $L/kernels-b16-$v.log 2>&1; echo "== kernels b16 $v"; head -16 $L/kernels-b16-$v.log | cut -c1-110
done
tar czf $OUT/logs.tgz -C $L .
