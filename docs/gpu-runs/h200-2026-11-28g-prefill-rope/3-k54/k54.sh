#!/usr/bin/env bash
# One H200: qkv_rope_store taking 4 tokens a warp (2 for heads of 129-256) from 1,024 tokens a
# pass, against one a warp (TANDEM_ROPE_MANY=1000000000), alternated; bench-prefill now chooses
# each prompt's token on the device (the engine's path) instead of copying every logits row.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log)"; grep FAIL $L/check-$d.log | head -5 | cut -c1-160; done
grep -E "norm\+rope|v store" $L/check-bf16.log | cut -c1-150 | head -12
for m in tiny-llama tiny-qwen3; do timeout 120 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(tail -1 $L/e2e-$m.log | cut -c1-120)"; done
OFF=TANDEM_ROPE_MANY=1000000000
for r in 1; do for c in "S $S 76 108" "S $S 8 1024" "Q $Q 76 108" "Q $Q 16 1024" "B $B 4 2048"; do set -- $c
  for v in new old; do e=X=1; [ $v = old ] && e=$OFF
    timeout 120 env $e $g bench-prefill $2 $3 $4 > $L/prefill-$1-$3x$4-$v-r$r.log 2>&1
    echo "r$r $1 $3x$4 $v: $(grep -E 'prefill kernel\)|small-tile' $L/prefill-$1-$3x$4-$v-r$r.log | sed -E 's/.*(\(prefill kernel\)|small-tile kernel instead): ([0-9.]+ ms).*= ([0-9.]+%).*/\1 \2 \3/' | tr '\n' ';') rope stage $(grep -m1 -oE 'qk norm, rope, kv store [0-9.]+ ms' $L/prefill-$1-$3x$4-$v-r$r.log | awk '{print $(NF-1)}')"
  done; done; done
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for c in "S $S" "Q $Q"; do set -- $c; for v in new old; do e=X=1; [ $v = old ] && e=$OFF
  timeout 150 env $e $NCU --clock-control none --section SpeedOfLight -k regex:qkv_rope_store --launch-skip 40 --launch-count 1 $g bench-prefill $2 76 108 > $L/ncu-rope-$1-$v.txt 2>&1
  echo "ncu rope $1 $v: $(grep -E '^\s+(Duration|DRAM Throughput)' $L/ncu-rope-$1-$v.txt | tr -s ' ' | tr '\n' ';')"; done; done
for r in 1 2; do for v in new old; do e=X=1; [ $v = old ] && e=$OFF
  timeout 120 env $e $t bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 1024 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served-$v-r$r.log 2>&1
  echo "r$r served workload $v: $(grep -E 'throughput|digest|per step' $L/engine-served-$v-r$r.log | tr -s ' ' | cut -c1-100 | tr '\n' ';')"
  timeout 200 env $e $t bench engine --device cuda --load-format dummy --model $Q --workload-file .gpu/pack/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano-$v-r$r.log 2>&1
  echo "r$r nano-vllm $v: $(grep -E 'throughput|digest|prefill phase' $L/engine-nano-$v-r$r.log | tr -s ' ' | cut -c1-100 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
