#!/usr/bin/env bash
# The small-tile kernel reading each page's block-table entry directly (the look-ahead, measured
# neutral, removed): checks, end to end, the 8B step beside the 16-row kernel, the workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 $g "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
sec check-bf16 check bf16; sec check-f16 check f16
for a in llama qwen3; do sec e2e-tiny-$a e2e tests/data/tiny-$a f16; done
timeout 240 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b.log 2>&1; grep -E "decode .* step" $L/decode-8b.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
f=$L/engine.log; timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
echo "engine: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
tar czf $OUT/logs.tgz -C $L .
