#!/usr/bin/env bash
# qkv_rope_store with every load issued first; the small-tile decode kernel with 4 warps per CTA
# (TANDEM_DEC_WARPS=4) and 4 CTAs per SM in the split rule, against the defaults.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 env "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
sec check-bf16 X=1 $g check bf16; sec check-f16-w4 TANDEM_DEC_WARPS=4 $g check f16; sec check-bf16-w4 TANDEM_DEC_WARPS=4 $g check bf16
sec e2e-tiny-qwen3 X=1 $g e2e tests/data/tiny-qwen3 f16; sec e2e-tiny-qwen3-w4 TANDEM_DEC_WARPS=4 $g e2e tests/data/tiny-qwen3 f16
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 200 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-60 | tr '\n' ';')"; }
for r in 1 2; do eng w2-$r X=1; eng w4-$r TANDEM_DEC_WARPS=4; eng w4c4-$r TANDEM_DEC_WARPS=4 TANDEM_SPLIT_CTAS_PER_SM=4; done
dec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
D="$g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,32,64,128,256 100-2048"
dec qwen3-w2 X=1 $D; dec qwen3-w4 TANDEM_DEC_WARPS=4 $D; dec qwen3-w4c4 TANDEM_DEC_WARPS=4 TANDEM_SPLIT_CTAS_PER_SM=4 $D
E="$g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024"
dec l8b-w2 X=1 $E; dec l8b-w4 TANDEM_DEC_WARPS=4 $E
tar czf $OUT/logs.tgz -C $L .
