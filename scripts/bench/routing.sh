#!/usr/bin/env bash
# Prefix-aware vs round-robin routing on a shared-prefix workload: 4 colocated workers (each
# with a KV cache that holds about four of the eight system prompts), one router, a real Redis
# for KV events. 8 system prompts of 512 tokens, 64-token user turns, 8 output tokens, 96
# requests at concurrency 4. Prints, per policy, the serving figures and the workers' prefix-cache
# hit rate (hits / queried prompt blocks). Needs redis-server (Debian package).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tandem-cli >&2
bin=target/release/tandem
tmp="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
sleep 0.5
ready() { for _ in $(seq 1 600); do grep -q TANDEM_READY "$1" 2>/dev/null && break; sleep 0.1; done; awk '/TANDEM_READY/{print $3; exit}' "$1"; }
hits() { # sums a counter over the workers
  local name=$1 total=0; for a in "${workers[@]}"; do
    v=$(curl -s "http://$a/metrics" | awk -v n="$name" '$1 ~ "^"n"[{ ]" || $1==n {s+=$2} END {print s+0}'); total=$(python3 -c "print($total+$v)"); done; echo "$total"; }
for policy in round-robin kv; do
  workers=()
  for i in 0 1 2 3; do
    TANDEM_NUM_THREADS=1 $bin decode --colocated --listen 127.0.0.1:0 --worker-id "w$i" --redis-url "redis://127.0.0.1:$rport" \
      --kv-cache-memory 96MiB >"$tmp/w$i.out" 2>"$tmp/w$i.err" &
    workers+=("$(ready "$tmp/w$i.out")")
  done
  $bin router --listen 127.0.0.1:0 --decode-workers "$(IFS=,; echo "${workers[*]}")" --routing-policy "$policy" \
    --redis-url "redis://127.0.0.1:$rport" >"$tmp/r.out" 2>"$tmp/r.err" &
  rpid=$!
  api="$(ready "$tmp/r.out")"
  sleep 1
  q0=$(hits tandem_prefix_cache_queries_total); h0=$(hits tandem_prefix_cache_hits_total)
  res=$($bin bench serve --base-url "http://$api/v1" --workload shared-prefix --num-prefixes 8 --prefix-len 512 \
        --input-len 64 --output-len 8 --ignore-eos --num-prompts 96 --concurrency 4 --quiet --label "$policy" --json - "$@" 2>/dev/null)
  q1=$(hits tandem_prefix_cache_queries_total); h1=$(hits tandem_prefix_cache_hits_total)
  rate=$(python3 -c "q=$q1-$q0; h=$h1-$h0; print(round(h/q,3) if q else 0)")
  printf '{"policy": "%s", "prefix_cache_hit_rate": %s, "result": %s}\n' "$policy" "$rate" "$(python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["result"]))' <<<"$res")"
  kill "$rpid"; for j in $(jobs -p); do :; done
  pkill -f "$bin decode --colocated --listen 127.0.0.1:0 --worker-id w" || true
  wait "$rpid" 2>/dev/null || true
  sleep 1
done
