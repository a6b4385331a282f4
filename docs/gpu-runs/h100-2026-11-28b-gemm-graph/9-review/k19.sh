#!/usr/bin/env bash
# After review: one silu_mul over 16-bit gate|up (the f32 variant removed). Checks and end to end.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; sec check-f16 X=1 $g check f16
grep -E "silu|gelu" $L/check-bf16.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110
for a in llama qwen3 gemma3; do sec e2e-tiny-$a X=1 $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-qwen3-bf16 X=1 $g e2e tests/data/tiny-qwen3 bf16
timeout 120 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/l8b.log 2>&1; grep -E "decode .* step" $L/l8b.log | sed -E 's/^\[[^]]*\] //' | cut -c1-130
tar czf $OUT/logs.tgz -C $L .
