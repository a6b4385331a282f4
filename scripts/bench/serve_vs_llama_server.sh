#!/usr/bin/env bash
# One serving workload against llama.cpp's llama-server (-np 32) and against `tandem up`
# (colocated and disaggregated), one after the other on this machine, measured by the same
# client (`tandem bench serve`). Prints each figure set and the ratios Tandem / llama-server.
# Default workload: 32 concurrent streamed requests, 64-token prompts, 64 tokens out
# (ignore_eos); extra arguments go to `tandem bench serve` (e.g. --num-prompts 64).
# TANDEM_CPU_KERNEL / LLAMA_CPP_ISA force lower paths on both sides (see cpu_vs_llama_cpp.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tandem-cli >&2
bin=target/release/tandem
llama_bin="$(bash scripts/bench/build_llama_cpp.sh)"
model="$($bin generate --help >/dev/null; python3 - <<'PY'
import os
d = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem")
print(os.path.join(d, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
)"
[ -f "$model" ] || $bin generate --prompt hi --max-tokens 1 >/dev/null  # fetches the default model
name=SmolLM2-135M-Instruct
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) logical CPUs); tandem kernel: $(TANDEM_NUM_THREADS=1 $bin bench kernels --tokens 1 --iters 1 | sed -n 's/^kernel \([A-Za-z0-9]*\),.*/\1/p') (TANDEM_CPU_KERNEL=${TANDEM_CPU_KERNEL:-auto}); llama.cpp: $llama_bin"
port="${TANDEM_BENCH_PORT:-18777}"
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
bench() { $bin bench serve --base-url "http://127.0.0.1:$port/v1" --model "$name" --num-prompts 32 --concurrency 32 \
            --input-len 64 --output-len 64 --ignore-eos --quiet --label "$1" --json "$out/$1.json" "${@:2}" >&2; }
wait_http() { for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }

LD_LIBRARY_PATH="$llama_bin" "$llama_bin/llama-server" -m "$model" --alias "$name" -np 32 -c 8192 -t "$(nproc)" \
  --host 127.0.0.1 --port "$port" >"$out/llama.log" 2>&1 &
pid=$!
wait_http || { cat "$out/llama.log" >&2; exit 1; }
bench llama-server "$@"
kill "$pid"; wait "$pid" 2>/dev/null || true

for mode in colocated disaggregated; do
  flags=(); [ "$mode" = colocated ] && flags+=(--colocated)
  $bin up --port "$port" "${flags[@]}" >"$out/up.out" 2>"$out/up.log" &
  pid=$!
  wait_http || { cat "$out/up.log" >&2; exit 1; }
  bench "tandem-$mode" "$@"
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
done

python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
runs = {n: json.load(open(os.path.join(d, n + ".json")))["result"] for n in ["llama-server", "tandem-colocated", "tandem-disaggregated"]}
rows = [("output tok/s", lambda r: r["output_throughput"]), ("TTFT p50 ms", lambda r: r["ttft"]["median_ms"]),
        ("TTFT p99 ms", lambda r: r["ttft"]["p99_ms"]), ("ITL p50 ms", lambda r: r["itl"]["median_ms"]),
        ("E2E p99 ms", lambda r: r["e2e"]["p99_ms"]), ("failed", lambda r: r["failed"])]
print(f"{'':16}{'llama-server':>14}{'colocated':>12}{'ratio':>8}{'disagg':>12}{'ratio':>8}")
for name, f in rows:
    b = f(runs["llama-server"]); c = f(runs["tandem-colocated"]); g = f(runs["tandem-disaggregated"])
    ratio = lambda x: f"{x / b:.2f}" if b else "-"
    print(f"{name:16}{b:>14.1f}{c:>12.1f}{ratio(c):>8}{g:>12.1f}{ratio(g):>8}")
print(json.dumps({"runs": runs}))
PY
