#!/usr/bin/env bash
# One H200: decode graphs of up to 16 sequences cut their contexts by length (the new default)
# against every graph cut evenly (TANDEM_SPLIT_BY_LENGTH_MAX=0), same binary, two rounds each:
# the decode step at 1–32 sequences, 16 greedy long-context requests through the engine (the
# digest must equal k79's 053c5b8aedc7217b), nano-vllm's workload (digest 702eafd0a1152da3).
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; Q=$C/configs/qwen3-0.6b.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
timeout 200 $g check bf16 > $L/check-bf16.log 2>&1; echo "$(el) check bf16 rc=$? pass=$(grep -c PASS $L/check-bf16.log) fail=$(grep -c FAIL $L/check-bf16.log)"
dec() { # tag max
  TANDEM_SPLIT_BY_LENGTH_MAX=$2 timeout 120 $g bench-decode $Q 1,2,4,8,16,32 100-2048 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')"
}
eng() { # tag max args...
  local tag=$1 m=$2; shift 2
  TANDEM_SPLIT_BY_LENGTH_MAX=$m timeout 100 $t bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag.log 2>&1
  echo "$(el) $tag rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-$tag.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
for r in 1 2; do
  dec even-r$r 0; dec bylen-r$r 16
  for m in 0 16; do eng long16-max$m-r$r $m --model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0; done
  for m in 0 16; do eng long8-max$m-r$r $m --model $Q --num-prompts 8 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 8 --temperature 0; done
done
for m in 0 16; do eng nano-max$m $m --model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384; done
python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd128 128 > /dev/null 2>&1
timeout 150 $g e2e /tmp/llama-hd128 f16 > $L/e2e-hd128.log 2>&1; echo "$(el) e2e hd128 rc=$? pass=$(grep -c PASS $L/e2e-hd128.log) fail=$(grep -c FAIL $L/e2e-hd128.log)"
echo "$(el) done"
