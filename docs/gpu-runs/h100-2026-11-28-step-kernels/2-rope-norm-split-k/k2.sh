#!/usr/bin/env bash
# One warp per head in qkv_rope_store, rmsnorm from registers, and residual projections cut
# along k (switch): checks, end to end, decode steps against the tree before (old), GEMM table.
set -u
g=.gpu/bin/tandem-gpu; og=.gpu/old/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
sec check-bf16 $g check bf16; sec check-f16 $g check f16
for a in llama qwen3; do sec e2e-tiny-$a $g e2e tests/data/tiny-$a f16; done
sec e2e-tiny-qwen3-split4 env TANDEM_SPLIT_K=4 $g e2e tests/data/tiny-qwen3 f16
sec e2e-tiny-llama-split2-bf16 env TANDEM_SPLIT_K=2 $g e2e tests/data/tiny-llama bf16
dec() { local n="$1"; shift; timeout 280 "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step|cut along k" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-150; }
dec qwen3-new $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,32,64,128,256 100-2048
dec qwen3-old $og bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,32,64,128,256 100-2048
dec smollm2-new $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300
dec smollm2-old $og bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300
timeout 200 $g bench-gemm .gpu/bin/configs/qwen3-0.6b.json 1,64,256 > $L/gemm-qwen3.log 2>&1; grep -E "gemm|slices|all shapes" $L/gemm-qwen3.log | sed -E 's/^\[[^]]*\] //' | cut -c1-170
tar czf $OUT/logs.tgz -C $L .
