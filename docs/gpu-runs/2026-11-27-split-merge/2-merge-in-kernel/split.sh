#!/usr/bin/env bash
# Balanced attention splits: checks, decode with mixed contexts (balanced vs uniform in each
# line), the rule's knobs, the 8B shape, and nano-vllm's workload balanced vs uniform alternating.
set -u
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for dt in bf16 f16; do $g check $dt > $L/check-$dt.log 2>&1; echo "check $dt rc=$? $(grep -c PASS $L/check-$dt.log) pass $(grep -c FAIL $L/check-$dt.log) fail"; done
for arch in llama qwen3; do timeout 120 $g e2e tests/data/tiny-$arch f16 > $L/e2e-tiny-$arch.log 2>&1; echo "e2e $arch rc=$? $(grep -c PASS $L/e2e-tiny-$arch.log) pass $(grep -c FAIL $L/e2e-tiny-$arch.log) fail"; done
summ() { grep -E "decode .* step|same number of ways" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-140; }
timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,8,32,64,128,256 100-2048 > $L/decode-qwen3-spread.log 2>&1; echo "== qwen3 spread default"; summ $L/decode-qwen3-spread.log
for v in "TANDEM_ATT_CTAS_PER_SM=4" "TANDEM_ATT_CTAS_PER_SM=16" "TANDEM_ATT_MIN_CHUNK=256"; do
  env $v timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 8,32,64,128,256 100-2048 > $L/decode-qwen3-spread-$v.log 2>&1; echo "== qwen3 spread $v"; summ $L/decode-qwen3-spread-$v.log | grep "decode"
done
timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-8b.log 2>&1; echo "== 8b 1024"; summ $L/decode-8b.log
TANDEM_ATT_CTAS_PER_SM=4 timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64 1024 > $L/decode-8b-k4.log 2>&1; echo "== 8b 1024 K=4"; summ $L/decode-8b-k4.log | grep decode
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do for v in balanced uniform; do
  f=$L/engine-$v-$i.log
  TANDEM_ATT_SPLITS=$v timeout 200 .gpu/tandem/tandem bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $v $i: $(grep -iE 'output tok/s|throughput|decode phase' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
