#!/usr/bin/env bash
# The small-tile decode kernel with its block-table entries loaded ahead (shuffled to the copy
# that needs them), against the 16-row kernel and against its page copies alone.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
$g check bf16 > $L/check-bf16.log 2>&1; echo "check bf16 rc=$? $(grep -c PASS $L/check-bf16.log) pass $(grep -c FAIL $L/check-bf16.log) fail"; grep FAIL $L/check-bf16.log | cut -c1-200
timeout 120 $g e2e tests/data/tiny-qwen3 f16 > $L/e2e-tiny-qwen3.log 2>&1; echo "e2e qwen3 rc=$? $(grep -c PASS $L/e2e-tiny-qwen3.log) pass"
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-110; grep -E "eager" "$1" | grep -oE "attention [0-9.]+ ms" | tr '\n' ' '; echo; }
for r in 1 2; do
timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-8b-$r.log 2>&1; echo "== 8b $r"; summ $L/decode-8b-$r.log
done
TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-copy-only.log 2>&1; echo "== 8b copies only"; summ $L/decode-8b-copy-only.log
timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,64,128,256 100-2048 > $L/decode-qwen3.log 2>&1; echo "== qwen3"; summ $L/decode-qwen3.log
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do
  f=$L/engine-$i.log
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done
tar czf $OUT/logs.tgz -C $L .
