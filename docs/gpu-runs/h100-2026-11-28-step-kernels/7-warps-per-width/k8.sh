#!/usr/bin/env bash
# Warps of the small-tile decode kernel per head width (2 for 64-wide heads, 4 for 128).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
timeout 60 $g info > $L/info.log 2>&1; grep dec $L/info.log | sed -E 's/^\[[^]]*\] //'
sec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep -E "FAIL" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
sec check-bf16 X=1 $g check bf16; sec e2e-tiny-llama X=1 $g e2e tests/data/tiny-llama f16
dec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|instead of the gemv" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
dec smollm2 X=1 $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300
dec smollm2-w4 TANDEM_DEC_WARPS=4 $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300
dec qwen3 X=1 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 64,256 100-2048
tar czf $OUT/logs.tgz -C $L .
