#!/usr/bin/env bash
# The split merge reading each split's (max, sum) once: checks, decode against 46d7329, the workload.
set -u
g=.gpu/bin/tandem-gpu; og=.gpu/old/tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/old/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for dt in bf16 f16; do $g check $dt > $L/check-$dt.log 2>&1; echo "check $dt rc=$? $(grep -c PASS $L/check-$dt.log) pass $(grep -c FAIL $L/check-$dt.log) fail"; done
for arch in llama qwen3 mistral; do timeout 120 $g e2e tests/data/tiny-$arch f16 > $L/e2e-tiny-$arch.log 2>&1; echo "e2e $arch rc=$? $(grep -c PASS $L/e2e-tiny-$arch.log) pass $(grep -c FAIL $L/e2e-tiny-$arch.log) fail"; done
python3 scripts/gpu/make_llama_shape.py /tmp/hd128 128 >/dev/null 2>&1; timeout 200 $g e2e /tmp/hd128 f16 > $L/e2e-hd128-f16.log 2>&1; echo "e2e hd128 f16 rc=$? $(grep -c PASS $L/e2e-hd128-f16.log) pass"
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-120; }
for r in 1 2; do for v in new old; do b=$g; [ $v = old ] && b=$og
  timeout 200 $b bench-decode .gpu/bin/configs/llama-3-8b.json 1,16,64,256 1024 > $L/decode-8b-$v-$r.log 2>&1; echo "== 8b 1024 $v $r"; summ $L/decode-8b-$v-$r.log
done; done
for v in new old; do b=$g; [ $v = old ] && b=$og
  timeout 240 $b bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,8,32,64,128,256 100-2048 > $L/decode-qwen3-spread-$v.log 2>&1; echo "== qwen3 spread $v"; summ $L/decode-qwen3-spread-$v.log
  timeout 200 $b bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,64,256 1024 > $L/decode-qwen3-1024-$v.log 2>&1; echo "== qwen3 1024 $v"; summ $L/decode-qwen3-1024-$v.log
done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2 3; do for v in new old; do b=$t; [ $v = old ] && b=$ot
  f=$L/engine-$v-$i.log
  timeout 200 $b bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $v $i: $(grep -iE 'throughput|decode phase' $f | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
