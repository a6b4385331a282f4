#!/usr/bin/env bash
# One H200: where a SmolLM2-shape prefill step's time goes (the served workload's cohorts of
# 76 x 108-token prompts = 8,208 tokens a step), against Qwen3; bench engine on the served
# workload with its per-step split at token budgets 8192 and 2048.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; S=.gpu/bin/configs/smollm2-135m-shape.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for pl in "76 108" "8 1024" "1 8192" "256 1"; do set -- $pl; timeout 120 $g bench-prefill $S $1 $2 > $L/prefill-smollm2-$1x$2.log 2>&1; echo "prefill smollm2 $1x$2: $(grep -vE '^\s*$' $L/prefill-smollm2-$1x$2.log | tail -6 | cut -c1-220)"; done
timeout 120 $g bench-prefill .gpu/bin/configs/qwen3-0.6b.json 76 108 > $L/prefill-qwen3-76x108.log 2>&1; echo "prefill qwen3 76x108: $(tail -4 $L/prefill-qwen3-76x108.log | cut -c1-220)"
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 240 $NCU --clock-control none --cache-control none --print-units base --csv --metrics gpu__time_duration.sum --launch-count 700 $g bench-prefill $S 76 108 > $L/ncu-prefill-smollm2.csv 2>$L/ncu.err; echo "ncu rc=$?"
python3 .gpu/pack/ncu_sum.py $L/ncu-prefill-smollm2.csv > $L/ncu-prefill-smollm2.txt 2>&1; head -30 $L/ncu-prefill-smollm2.txt
for b in 8192 2048; do timeout 120 $t bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 1024 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens $b > $L/engine-b$b.log 2>&1; echo "engine budget $b: $(grep -E 'throughput|steps|per step|prefill phase' $L/engine-b$b.log | tr -s ' ' | tr '\n' ';')"; done
tar czf $OUT/logs.tgz -C $L .
