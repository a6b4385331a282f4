#!/usr/bin/env bash
# Split merge with the loads unrolled: checks, TP=2 check, 70B TP=2 and 8B decode against 46d7329, the workload.
set -u
g=.gpu/bin/tandem-gpu; og=.gpu/old/tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/old/tandem
L=/tmp/logs; mkdir -p $L
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for dt in bf16 f16; do $g check $dt > $L/check-$dt.log 2>&1; echo "check $dt rc=$? $(grep -c PASS $L/check-$dt.log) pass $(grep -c FAIL $L/check-$dt.log) fail"; done
timeout 120 $g e2e tests/data/tiny-qwen3 f16 > $L/e2e-tiny-qwen3.log 2>&1; echo "e2e qwen3 rc=$? $(grep -c PASS $L/e2e-tiny-qwen3.log) pass"
timeout 120 $g tp-check tests/data/tiny-llama 2 8 64 > $L/tp-check-tiny-llama.log 2>&1; echo "tp-check tiny llama rc=$? $(grep PASS $L/tp-check-tiny-llama.log | cut -c1-80)"
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
for r in 1 2; do for v in new old; do b=$g; [ $v = old ] && b=$og
  timeout 300 $b bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 > $L/decode-70b-$v-$r.log 2>&1; echo "== 70b tp2 $v $r"; summ $L/decode-70b-$v-$r.log
  timeout 200 $b bench-decode .gpu/bin/configs/llama-3-8b.json 1,64,256 1024 > $L/decode-8b-$v-$r.log 2>&1; echo "== 8b $v $r"; summ $L/decode-8b-$v-$r.log
done; done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do for v in new old; do b=$t; [ $v = old ] && b=$ot
  f=$L/engine-$v-$i.log
  timeout 200 $b bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $v $i: $(grep -iE 'throughput|decode phase' $f | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
