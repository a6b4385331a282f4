#!/usr/bin/env bash
# The tree with the small-tile decode kernel: every check, the end-to-end models, decode steps,
# and the nano-vllm workload alternating with TANDEM_DEC_KERNEL=off (the 16-row kernel).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
sec() { local n="$1"; shift; timeout 240 $g "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(grep -c PASS $L/$n.log) pass $(grep -c FAIL $L/$n.log) fail"; grep FAIL $L/$n.log | cut -c1-180; }
$g info > $L/info.log 2>&1; grep -E "mma128|dec" $L/info.log
sec check-bf16 check bf16; sec check-f16 check f16
for a in llama qwen2 qwen3 mistral phi3; do sec e2e-tiny-$a e2e tests/data/tiny-$a f16; done
for hd in 64 128; do python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd$hd $hd > /dev/null 2>&1 && sec e2e-llama-hd$hd e2e /tmp/llama-hd$hd f16; done
python3 scripts/gpu/make_gemma3_shape.py /tmp/gemma3 > /dev/null 2>&1; sec windows windows tests/data/tiny-gemma3 tests/data/tiny-mistral /tmp/gemma3
summ() { grep -E "decode .* step" "$1" | sed -E 's/^\[[^]]*\] //' | cut -c1-120; }
timeout 240 $g bench-decode .gpu/bin/configs/llama-3-8b.json 1,16,64,256 1024 > $L/decode-8b.log 2>&1; echo "== 8b"; summ $L/decode-8b.log
timeout 240 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 1,64,256 1024 > $L/decode-qwen3.log 2>&1; echo "== qwen3 1024"; summ $L/decode-qwen3.log
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2 3; do for v in on off; do
  f=$L/engine-$v-$i.log
  TANDEM_DEC_KERNEL=$v timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "engine dec=$v $i: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
