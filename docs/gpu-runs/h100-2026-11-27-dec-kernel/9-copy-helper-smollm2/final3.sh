#!/usr/bin/env bash
# After the page copy became one helper: checks, end to end; then where a small model's served
# decode step goes (SmolLM2-135M shape, 256 sequences of ~200 positions, eager profile).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 $g "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
$g info > $L/info.log 2>&1; grep -E "dec|mma" $L/info.log | cut -c1-140
sec check-bf16 check bf16; sec check-f16 check f16
for a in llama qwen3; do sec e2e-tiny-$a e2e tests/data/tiny-$a f16; done
python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd64 64 > /dev/null 2>&1 && sec e2e-llama-hd64 e2e /tmp/llama-hd64 f16
timeout 200 $g bench-decode .gpu/pack/smollm2-135m-shape.json 1,64,256 100-300 > $L/decode-smollm2.log 2>&1; grep -E "decode .* step|eager" $L/decode-smollm2.log | sed -E 's/^\[[^]]*\] //' | cut -c1-400
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
f=$L/engine.log; timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
echo "engine: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
tar czf $OUT/logs.tgz -C $L .
