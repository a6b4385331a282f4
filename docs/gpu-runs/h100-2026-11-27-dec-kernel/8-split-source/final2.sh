#!/usr/bin/env bash
# The tree after the kernel source was split into cuda/src/kernels/*.cu: checks, end to end,
# one decode measurement and the workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 $g "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
$g info > $L/info.log 2>&1; grep -E "dec128|mma128" $L/info.log
sec check-bf16 check bf16; sec check-f16 check f16
for a in llama qwen3 phi3; do sec e2e-tiny-$a e2e tests/data/tiny-$a f16; done
python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd128 128 > /dev/null 2>&1 && sec e2e-llama-hd128 e2e /tmp/llama-hd128 f16
timeout 240 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b.log 2>&1; grep -E "decode .* step" $L/decode-8b.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do f=$L/engine-$i.log
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done
tar czf $OUT/logs.tgz -C $L .
