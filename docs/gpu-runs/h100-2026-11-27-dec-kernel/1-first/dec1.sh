#!/usr/bin/env bash
# The small-tile tensor-core decode kernel (attention_dec*) against the 16-row one: occupancy,
# checks, decode steps of the Llama-3-8B and Qwen3-0.6B shapes, the nano-vllm workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
(ls /usr/local/cuda/bin; which ncu nsys; id) > $L/tools.txt 2>&1; grep -E "ncu|nsys|uid" $L/tools.txt
$g info > $L/info.log 2>&1; cat $L/info.log
for d in bf16 f16; do $g check $d > $L/check-$d.log 2>&1; echo "check $d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; grep FAIL $L/check-$d.log | cut -c1-200; done
grep "small tiles" $L/check-bf16.log | cut -c1-170
for m in llama qwen3; do timeout 120 $g e2e tests/data/tiny-$m f16 > $L/e2e-tiny-$m.log 2>&1; echo "e2e $m rc=$? $(grep -c PASS $L/e2e-tiny-$m.log) pass"; done
summ() { grep -E "decode .* step|16-row" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-150; grep -E "eager" "$1" | grep -oE "attention [0-9.]+ ms" | tr '\n' ' '; echo; }
timeout 240 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-8b.log 2>&1; echo "== 8b"; summ $L/decode-8b.log
timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,64,128,256 100-2048 > $L/decode-qwen3.log 2>&1; echo "== qwen3"; summ $L/decode-qwen3.log
TANDEM_DEC_WARPS=4 timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-w4.log 2>&1; echo "== 8b warps 4"; summ $L/decode-8b-w4.log
TANDEM_CUDA_DEFINES=TANDEM_DEC_ROUND timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-round.log 2>&1; echo "== 8b round once"; summ $L/decode-8b-round.log
TANDEM_MMA_STAGES=3 timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-s3.log 2>&1; echo "== 8b stages 3"; summ $L/decode-8b-s3.log
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do
  f=$L/engine-$i.log
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done
tar czf $OUT/logs.tgz -C $L .
