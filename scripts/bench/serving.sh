#!/usr/bin/env bash
# Serving benchmark of `tandem up`, colocated and disaggregated, on this machine: 32 concurrent
# streamed requests, 64-token prompts, 64 output tokens (extra arguments go to
# `tandem bench serve`, e.g. `scripts/bench/serving.sh --num-prompts 64`). Prints each table and
# one JSON line per topology. For the side-by-side with llama-server see serve_vs_llama_server.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tandem-cli >&2
bin=target/release/tandem
port="${TANDEM_BENCH_PORT:-18765}"
for mode in colocated disaggregated; do
  flags=()
  [ "$mode" = colocated ] && flags+=(--colocated)
  log="$(mktemp)"
  $bin up --port "$port" "${flags[@]}" >"$log.out" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do grep -q TANDEM_READY "$log.out" 2>/dev/null && break; sleep 0.1; done
  if ! grep -q TANDEM_READY "$log.out"; then cat "$log" >&2; kill "$pid" || true; exit 1; fi
  res="$($bin bench serve --base-url "http://127.0.0.1:$port/v1" --num-prompts 32 --concurrency 32 --input-len 64 \
        --output-len 64 --ignore-eos --quiet --label "$mode" --json - "$@")"
  printf '{"topology": "%s", "result": %s}\n' "$mode" "$(python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["result"]))' <<<"$res")"
  kill -INT "$pid"; wait "$pid" || true
  rm -f "$log" "$log.out"
done
