#!/usr/bin/env bash
# Serving benchmark of `tandem up`, colocated and disaggregated, on this machine: 32 concurrent
# streamed requests, 64-token prompts, 64 output tokens (override with the bench's flags, e.g.
# `scripts/bench/serving.sh --requests 64`). Builds the release binary, installs the openai SDK
# (scripts/test/python_env.sh) and prints one JSON line per topology.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tandem-cli >&2
py="$(bash scripts/test/python_env.sh)"
port="${TANDEM_BENCH_PORT:-18765}"
for mode in colocated disaggregated; do
  flags=()
  [ "$mode" = colocated ] && flags+=(--colocated)
  log="$(mktemp)"
  target/release/tandem up --port "$port" "${flags[@]}" >"$log.out" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do grep -q TANDEM_READY "$log.out" 2>/dev/null && break; sleep 0.1; done
  if ! grep -q TANDEM_READY "$log.out"; then cat "$log" >&2; kill "$pid" || true; exit 1; fi
  printf '{"topology": "%s", "result": %s}\n' "$mode" "$("$py" scripts/bench/serve_bench.py "http://127.0.0.1:$port/v1" SmolLM2-135M-Instruct "$@")"
  kill -INT "$pid"; wait "$pid" || true
  rm -f "$log" "$log.out"
done
