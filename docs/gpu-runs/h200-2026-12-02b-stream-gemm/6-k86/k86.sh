#!/usr/bin/env bash
# One H200: the tree with gemv limited to matrices of at most 16 MiB (the default): the checks,
# the step at one sequence of the three shapes (and Qwen3 at 2 and 32), 16 greedy requests.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; Q=$C/configs/qwen3-0.6b.json; E=$C/configs/llama-3-8b.json; S=$C/configs/smollm2-135m-shape.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
timeout 200 $g check bf16 > $L/check-bf16.log 2>&1; echo "$(el) check bf16 rc=$? pass=$(grep -c PASS $L/check-bf16.log) fail=$(grep -c FAIL $L/check-bf16.log)"
grep -E 'FAIL|gemv' $L/check-bf16.log | cut -c1-150
dec() { # tag cfg batches contexts
  timeout 100 $g bench-decode $2 $3 $4 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ') cuBLAS: $(grep -E "instead of Tandem" $L/decode-$1.log | sed -E 's/.*step ([0-9.]+) ms, ([0-9.]+)%.*/\1 (\2%)/' | tr '\n' ' ')"
}
dec E $E 1 1024; dec Q $Q 1,2,32 100-2048; dec S $S 1 100-300
timeout 100 $t bench engine --device cuda --load-format dummy --model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0 > $L/engine-long16.log 2>&1
echo "$(el) long16 rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-long16.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
echo "$(el) done"
