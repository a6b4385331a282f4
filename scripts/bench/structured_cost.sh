#!/usr/bin/env bash
# What constrained decoding costs: `tandem bench engine` decode throughput with and without a
# JSON-schema constraint (scripts/bench/json_schema_cost.json: an array of at least 20 order
# objects, so no constrained output can end before max_tokens and both sides decode the same
# number of tokens), at batch 1 and batch 32, REPS runs each, alternating; prints each run and
# the median ratio constrained / free. Records the CPU and the kernel path.
# Usage: [TANDEM_BIN=target/release/tandem] [REPS=3] [BATCHES="1 32"] [TANDEM_CPU_KERNEL=...]
#        [BENCH_ARGS="--device cuda --load-format dummy --model SHAPE.gguf"] scripts/bench/structured_cost.sh
# On a GPU host the model can be a GGUF without its tensors (scripts/gpu/gguf_metadata_only.py):
# random weights of the model's shape, with its real tokenizer.
set -euo pipefail
bin="${TANDEM_BIN:-target/release/tandem}"
reps="${REPS:-3}"
batches="${BATCHES:-1 32}"
read -r -a extra_args <<< "${BENCH_ARGS:-}"
schema="$(dirname "$0")/json_schema_cost.json"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') family $(lscpu | sed -n 's/^CPU family: *//p'), $(nproc) cores; kernel: ${TANDEM_CPU_KERNEL:-auto}"
command -v nvidia-smi >/dev/null && echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "bench args: ${BENCH_ARGS:-none}"
for batch in $batches; do
  free=(); constrained=()
  for _ in $(seq "$reps"); do
    for mode in free constrained; do
      extra=(); [ "$mode" = constrained ] && extra=(--json-schema "$schema")
      tps=$("$bin" bench engine --json --num-prompts "$batch" --input-len 64 --min-input-len 64 \
        --output-len 128 --min-output-len 128 --temperature 1 --max-num-seqs "$batch" "${extra_args[@]}" "${extra[@]}" 2>/dev/null |
        python3 -c "import json,sys; r=json.load(sys.stdin); assert r['generated_tokens'] == r['output_tokens'], r; print(round(r['decode_tok_per_s'], 1))")
      echo "batch $batch $mode decode tok/s $tps"
      if [ "$mode" = free ]; then free+=("$tps"); else constrained+=("$tps"); fi
    done
  done
  python3 - "${free[*]}" "${constrained[*]}" "$batch" <<'PY'
import statistics, sys
f = [float(x) for x in sys.argv[1].split()]; c = [float(x) for x in sys.argv[2].split()]
print(f"batch {sys.argv[3]}: free median {statistics.median(f):.1f}, constrained median {statistics.median(c):.1f} tok/s, ratio {statistics.median(c) / statistics.median(f):.3f}")
PY
done
