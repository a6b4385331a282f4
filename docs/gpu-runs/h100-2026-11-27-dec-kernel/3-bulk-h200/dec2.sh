#!/usr/bin/env bash
# The small-tile decode kernel copying pages with bulk copies (TMA, the default on sm_90)
# against cp.async (TANDEM_DEC_CP_ASYNC), with 2, 3 and 4 stages: checks, decode steps, ncu.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
$g info > $L/info.log 2>&1; grep dec $L/info.log
$g check bf16 > $L/check-bf16.log 2>&1; echo "check bf16 rc=$? $(grep -c PASS $L/check-bf16.log) pass $(grep -c FAIL $L/check-bf16.log) fail"; grep FAIL $L/check-bf16.log | cut -c1-200
TANDEM_MMA_STAGES=4 $g check bf16 > $L/check-bf16-s4.log 2>&1; echo "check bf16 s4 rc=$? $(grep -c PASS $L/check-bf16-s4.log) pass $(grep -c FAIL $L/check-bf16-s4.log) fail"
timeout 120 $g e2e tests/data/tiny-qwen3 f16 > $L/e2e-tiny-qwen3.log 2>&1; echo "e2e qwen3 rc=$? $(grep -c PASS $L/e2e-tiny-qwen3.log) pass"
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-110; grep -E "eager" "$1" | grep -oE "attention [0-9.]+ ms" | tr '\n' ' '; echo; }
for v in bulk cpasync; do for s in 2 3 4; do
  d=""; [ $v = cpasync ] && d=TANDEM_DEC_CP_ASYNC
  TANDEM_CUDA_DEFINES=$d TANDEM_MMA_STAGES=$s timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-$v-s$s.log 2>&1; echo "== 8b $v stages $s"; summ $L/decode-8b-$v-s$s.log
done; done
timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,64,128,256 100-2048 > $L/decode-qwen3.log 2>&1; echo "== qwen3 bulk s2"; summ $L/decode-qwen3.log
timeout 280 /usr/local/cuda/bin/ncu --kernel-name attention_dec128 --launch-skip 40 --launch-count 1 --set full $g bench-decode .gpu/bin/configs/llama-3-8b.json 64 1024 > $L/ncu-dec128-bulk.txt 2>&1
grep -E "DRAM Throughput|Duration|Achieved Active|Warp Cycles Per Issued" $L/ncu-dec128-bulk.txt
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do
  f=$L/engine-$i.log
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done
tar czf $OUT/logs.tgz -C $L .
