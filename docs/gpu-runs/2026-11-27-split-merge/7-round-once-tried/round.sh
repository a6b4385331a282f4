#!/usr/bin/env bash
# The decode kernel with Q and P rounded once (TANDEM_DEC_ROUND_QP) against the split default.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
R="TANDEM_DEC_ROUND_QP"
TANDEM_CUDA_DEFINES=$R $g check bf16 > $L/check-bf16-round.log 2>&1; echo "check bf16 round rc=$? $(grep -c PASS $L/check-bf16-round.log) pass $(grep -c FAIL $L/check-bf16-round.log) fail"; grep -i "tensor-core\|small-tile\|FAIL" $L/check-bf16-round.log | cut -c1-170 | head -12
python3 scripts/gpu/make_llama_shape.py /tmp/hd128 128 >/dev/null 2>&1
for v in split round; do d=""; [ $v = round ] && d=$R
  TANDEM_CUDA_DEFINES=$d timeout 200 $g e2e /tmp/hd128 bf16 > $L/e2e-hd128-bf16-$v.log 2>&1; echo "e2e hd128 bf16 $v rc=$? $(grep -c PASS $L/e2e-hd128-bf16-$v.log) pass $(grep -c FAIL $L/e2e-hd128-bf16-$v.log) fail"
done
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
for r in 1 2; do for v in split round; do d=""; [ $v = round ] && d=$R
  TANDEM_CUDA_DEFINES=$d timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 64,128,256 100-2048 > $L/decode-qwen3-$v-$r.log 2>&1; echo "== qwen3 spread $v $r"; summ $L/decode-qwen3-$v-$r.log
  TANDEM_CUDA_DEFINES=$d timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-$v-$r.log 2>&1; echo "== 8b $v $r"; summ $L/decode-8b-$v-$r.log
done; done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do for v in split round; do d=""; [ $v = round ] && d=$R
  f=$L/engine-$v-$i.log
  TANDEM_CUDA_DEFINES=$d timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine $v $i: $(grep -iE 'throughput|decode phase' $f | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
