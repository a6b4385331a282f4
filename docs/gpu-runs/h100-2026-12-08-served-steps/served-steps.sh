#!/usr/bin/env bash
# A device run planned on 2026-12-07 and not run yet (no device was lent that stop). Needs
# .gpu/c/ with tandem-gpu.xz and tandem.xz built from 4cfd381c or later, and tandem-gpu-nofix.xz
# (the same tree with `long_chunks` forced false in cuda/src/backend/mixed.rs). Once run, move it
# to docs/gpu-runs/<device>-<date>-served-steps/ with its logs.
# Where the served rounds' extra time goes. On an NVIDIA H200 (16-core host; SmolLM2 shape from a
# random Q8_0 file in f16, decode and mixed-step graphs, attention_dec_rope64, stream products of
# 2-32 rows, cuBLAS above) the served steps with prompts took 0.45-0.49 s of a ~1.9 s round
# against the engine's 0.26 s (k121, docs/gpu-runs/h200-h100-2026-12-06e/), and a round had 5-10
# steps of 16-50 ms (k143, docs/gpu-runs/h100-h200-2026-12-07f/) where the engine's longest is ~8 ms. Hypothesis: steps whose shape the process meets for the
# first time (eager mixed steps; cuBLAS loading the kernels it picks for a new row count, CUDA
# loads modules lazily) and the captures of mixed-step graphs. Served rounds (tandem up --device
# cuda defaults against bench engine, 2,048 requests of 108 + 128 at 256 streams) with the step
# log (each step's wall, device time, prompt tokens, decode rows; the slowest listed), default
# against CUDA_MODULE_LOADING=EAGER (every module loaded at start) and without mixed-step
# graphs for them, alternating.
#
# First, the mixed-step graphs' key: a graph captured from a step without chunks for the prefill
# kernel (no prefill-kernel launch, RoPE fused into the small-tile kernel) was replayed for a step
# of the same rows, logits rows and tile kernel with such a chunk. e2e's new check (a 64-token
# chunk after a step of its shape without one) on random Llamas of head width 64 and 128, with
# the key fixed (tandem-gpu) and without (tandem-gpu-nofix: the same tree, long_chunks false).
source scripts/gpu/session.sh
xz -dc $C/tandem-gpu-nofix.xz > .gpu/bin/tandem-gpu-nofix; chmod +x .gpu/bin/tandem-gpu-nofix
for hd in 64 128; do
  python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd$hd $hd > /dev/null 2>&1
  for b in tandem-gpu tandem-gpu-nofix; do
    for dt in f16 bf16; do
      timeout 120 .gpu/bin/$b e2e /tmp/llama-hd$hd $dt > $L/e2e-hd$hd-$b-$dt.log 2>&1
      echo "$(el) e2e hd$hd $b $dt rc=$? pass=$(grep -c PASS $L/e2e-hd$hd-$b-$dt.log) fail=$(grep -c FAIL $L/e2e-hd$hd-$b-$dt.log)"
      grep -E "FAIL|64-token chunk" $L/e2e-hd$hd-$b-$dt.log | cut -c1-260
    done
  done
done
# nograph: TANDEM_MIXED_GRAPH_MAX_ROWS=64, so that the served steps with prompts (256 rows and
# more) run eagerly and nothing is captured after start-up.
for tag in def-1 nograph-1 eager-1 def-2 eager-2; do
  [ $(( $(date +%s) - T0 )) -gt ${GATE:-330} ] && { echo "skipped $tag (time)"; continue; }
  echo "== $tag"
  case ${tag%-*} in
    eager) CUDA_MODULE_LOADING=EAGER STEP_LOG=1 served 1 ;;
    nograph) TANDEM_MIXED_GRAPH_MAX_ROWS=64 STEP_LOG=1 served 1 ;;
    *) STEP_LOG=1 served 1 ;;
  esac
  grep -h "slowest" $L/served/peer/*-steps-shared.txt | cut -c1-600
  f=$L/served/peer/round1-up-shared-captures.txt
  echo "mixed-step graphs captured: $(wc -l < $f), $(grep -o 'ms=[0-9.]*' $f | cut -d= -f2 | awk '{s+=$1} END {printf "%.0f ms", s}')"
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
# Qwen3-0.6B's prefill (nano-vllm's steps with prompts ran at ~36 % of the GEMM peak on an NVIDIA
# H100 80GB HBM3 in k141: 9 steps, 0.475 s for ~137 TFLOP (142,827 prompt tokens' products at
# 0.88 GFLOP a token, attention estimated) against k133's 795 TFLOP/s cuBLAS bf16 peak; bf16 dummy
# weights, cuBLAS products, the flash-attention prefill kernel): the eager
# stages of 16 x 1,024 and 32 x 512 tokens.
for pl in "16 1024" "32 512"; do
  [ $(( $(date +%s) - T0 )) -gt $(( ${GATE:-330} + 150 )) ] && { echo "skipped prefill $pl (time)"; continue; }
  timeout 200 $g bench-prefill $Q $pl > "$L/prefill-q3-${pl/ /x}.log" 2>&1
  echo "$(el) prefill q3 $pl rc=$?"; grep -E "\] prefill |eager stages" "$L/prefill-q3-${pl/ /x}.log" | cut -c1-900
done
finish
