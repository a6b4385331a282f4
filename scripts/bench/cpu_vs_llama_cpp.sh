#!/usr/bin/env bash
# Tandem's CPU engine and llama.cpp side by side on the same GGUF and the same workloads, in one
# run, printing each figure and the ratio Tandem / llama.cpp:
#   prompt processing of 512 tokens, single-stream decode of 128 tokens (llama-bench pp512/tg128),
#   batched decode of 32 sequences with 64-token prompts and 64 new tokens (llama-batched-bench),
#   and Tandem's peak RSS with a 16k-token KV pool.
# Usage: scripts/bench/cpu_vs_llama_cpp.sh   (builds llama.cpp once, see build_llama_cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS="${THREADS:-$(nproc)}"
cargo build --release -q -p tandem-cli
TANDEM=target/release/tandem
MODEL="$($TANDEM generate --prompt x --max-tokens 1 >/dev/null 2>&1; python3 -c 'import os;print(os.path.join(os.environ.get("TANDEM_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),"tandem"),"models","SmolLM2-135M-Instruct.Q4_1.gguf"))')"
BIN="$(scripts/bench/build_llama_cpp.sh)"
echo "model: $MODEL"; echo "threads: $THREADS"; echo

lb="$("$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -fa 1 -r 3 -o json)"
l_pp=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([r["avg_ts"] for r in d if r["n_prompt"]==512][0])' "$lb")
l_tg=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print([r["avg_ts"] for r in d if r["n_gen"]==128][0])' "$lb")
lbb="$("$BIN/llama-batched-bench" -m "$MODEL" -t "$THREADS" -npp 64 -ntg 64 -npl 32 -fa on -c 4096 2>/dev/null | grep -E '^\|\s+64' | tail -1)"
l_btg=$(echo "$lbb" | awk -F'|' '{gsub(/ /,"",$9); print $9}')
l_btot=$(echo "$lbb" | awk -F'|' '{gsub(/ /,"",$11); print $11}')

ts="$(TANDEM_NUM_THREADS=$THREADS $TANDEM bench single --prompt-tokens 512 --decode-tokens 128 --repeat 3 --json)"
t_pp=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prompt_tok_per_s"])' "$ts")
t_tg=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decode_tok_per_s"])' "$ts")
te="$(TANDEM_NUM_THREADS=$THREADS $TANDEM bench engine --num-prompts 32 --input-len 64 --min-input-len 64 --output-len 64 --min-output-len 64 --max-num-seqs 32 --max-num-batched-tokens 2048 --json)"
t_btg=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decode_tok_per_s"])' "$te")
t_btot=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["total_tok_per_s"])' "$te")
# 32 sequences of 480 + 32 tokens fill every slot of the 16k-token pool, so all of it is resident.
tr="$(TANDEM_NUM_THREADS=$THREADS $TANDEM bench engine --num-prompts 32 --input-len 480 --min-input-len 480 --output-len 32 --min-output-len 32 --max-num-seqs 32 --max-num-batched-tokens 2048 --no-prefix-caching --kv-cache-memory $((16384 * 2 * 30 * 192 * 4)) --json)"
t_rss=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["peak_rss_mib"])' "$tr")

python3 - "$t_pp" "$l_pp" "$t_tg" "$l_tg" "$t_btg" "$l_btg" "$t_btot" "$l_btot" "$t_rss" <<'PY'
import sys
v = [float(x) for x in sys.argv[1:]]
rows = [("prompt processing, 512 tokens (tok/s)", v[0], v[1], 1.3),
        ("single-stream decode, 128 tokens (tok/s)", v[2], v[3], 1.3),
        ("batched decode, 32 x (64 + 64) (tok/s)", v[4], v[5], 1.5),
        ("batched total, 32 x (64 + 64) (tok/s)", v[6], v[7], None)]
print(f"{'workload':44} {'tandem':>9} {'llama.cpp':>10} {'ratio':>7} {'target':>7}")
for name, t, l, goal in rows:
    print(f"{name:44} {t:9.1f} {l:10.1f} {t/l:7.2f} {('>= %.1f' % goal) if goal else '':>7}")
print(f"{'peak RSS, 16k-token KV pool (MiB)':44} {v[8]:9.0f} {'':>10} {'':>7} {'<= 1024':>7}")
PY
