#!/usr/bin/env bash
# The tensor-core decode kernel with 2 (default), 3 and 4 pages per warp in shared memory
# (TANDEM_MMA_STAGES): checks, decode steps of the Llama-3-8B and Qwen3-0.6B shapes, the workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for s in 3 4; do TANDEM_MMA_STAGES=$s $g check bf16 > $L/check-bf16-s$s.log 2>&1; echo "check bf16 stages $s rc=$? $(grep -c PASS $L/check-bf16-s$s.log) pass $(grep -c FAIL $L/check-bf16-s$s.log) fail"; done
TANDEM_MMA_STAGES=3 timeout 120 $g e2e tests/data/tiny-qwen3 f16 > $L/e2e-tiny-qwen3-s3.log 2>&1; echo "e2e qwen3 s3 rc=$? $(grep -c PASS $L/e2e-tiny-qwen3-s3.log) pass"
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-118; }
for r in 1 2; do for s in 2 3 4; do
  TANDEM_MMA_STAGES=$s timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-8b-s$s-$r.log 2>&1; echo "== 8b s$s $r"; summ $L/decode-8b-s$s-$r.log
done; done
for s in 2 3 4; do
  TANDEM_MMA_STAGES=$s timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,32,64,128,256 100-2048 > $L/decode-qwen3-spread-s$s.log 2>&1; echo "== qwen3 spread s$s"; summ $L/decode-qwen3-spread-s$s.log
done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do for s in 2 3 4; do
  f=$L/engine-s$s-$i.log
  TANDEM_MMA_STAGES=$s timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine s$s $i: $(grep -E 'throughput|decode phase|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
