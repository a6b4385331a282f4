#!/usr/bin/env bash
# One H200: the tree after review (44d8340, not yet run on a GPU) checked — kernel checks in
# both 16-bit types, random Llamas end to end, engine digests against the records of
# docs/gpu-runs/h200-2026-12-01-fused-rope/ — and the balanced split rule
# (TANDEM_SPLIT_BALANCED=F,L: decode graphs get F tile entries a sequence, contexts cut into
# pieces of one length of at least L positions) against the uniform rule, same binary.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
S=$C/configs/smollm2-135m-shape.json; Q=$C/configs/qwen3-0.6b.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 f16; do
  timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "$(el) check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log)"; grep -E "FAIL" $L/check-$d.log | cut -c1-300
done
dec() { # tag rule cfg batches contexts
  if [ $2 = off ]; then timeout 120 $g bench-decode $3 $4 $5 > $L/decode-$1.log 2>&1
  else TANDEM_SPLIT_BALANCED=$2 timeout 120 $g bench-decode $3 $4 $5 > $L/decode-$1.log 2>&1; fi
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')"
}
for rule in off 2,256 3,128 4,128; do dec Q-$rule $rule $Q 16,32,64,128,256 100-2048; done
for rule in off 2,256 4,128; do dec Q1024-$rule $rule $Q 16,64,256 1024; done
for hd in 64 128; do
  python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd$hd $hd > /dev/null 2>&1
  for rule in off 2,64; do [ $hd = 64 ] && [ $rule != off ] && continue
    if [ $rule = off ]; then timeout 150 $g e2e /tmp/llama-hd$hd f16 > $L/e2e-hd$hd-$rule.log 2>&1
    else TANDEM_SPLIT_BALANCED=$rule timeout 150 $g e2e /tmp/llama-hd$hd f16 > $L/e2e-hd$hd-$rule.log 2>&1; fi
    echo "$(el) e2e hd$hd rule $rule rc=$? pass=$(grep -c PASS $L/e2e-hd$hd-$rule.log) fail=$(grep -c FAIL $L/e2e-hd$hd-$rule.log)"
  done
done
eng() { # tag rule args...
  local tag=$1 rule=$2; shift 2
  if [ $rule = off ]; then timeout 100 $t bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag.log 2>&1
  else TANDEM_SPLIT_BALANCED=$rule timeout 100 $t bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag.log 2>&1; fi
  echo "$(el) $tag rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-$tag.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
for i in 1 2; do for rule in off 2,256; do eng nano-$rule-$i $rule --model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384; done; done
eng served-off off --model $S --dtype f16 --num-prompts 2048 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192
eng long-greedy-16-off off --model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0
eng long-greedy-16-b 2,256 --model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0
for rule in off 2,128; do dec S-$rule $rule $S 1,64,256 100-300; done
echo "$(el) done"
