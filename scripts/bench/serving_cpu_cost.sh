#!/usr/bin/env bash
# CPU time the serving path spends per streamed token: `tandem up --colocated` on the tiny random
# Llama of tests/data (its engine is fast enough that the router and the worker's runtime carry a
# large share), 1,024 requests of 108 + 128 tokens at 256 streams through `tandem bench serve`,
# per round the router's and the decode worker's CPU time (from /proc) per output token and the
# engine thread's host phases per step and its dispatch of their outputs to the streams (from the
# worker's /metrics). Compare two binaries by
# alternating runs: `scripts/bench/serving_cpu_cost.sh [TANDEM] [ROUNDS]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/tandem}"
rounds="${2:-3}"
port="${TANDEM_BENCH_PORT:-18766}"
model=tests/data/tiny-llama
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p tandem-cli)" >&2; exit 2; }
log="$(mktemp)"
"$bin" up --model "$model" --colocated --port "$port" --max-num-seqs 256 --max-num-batched-tokens 8192 >"$log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -f "$log" "$log".m0 "$log".m1' EXIT
for _ in $(seq 1 600); do grep -q TANDEM_READY "$log" && break; sleep 0.1; done
grep -q TANDEM_READY "$log" || { cat "$log" >&2; exit 1; }
router=$(pgrep -P "$up" -f " router --listen")
worker=$(pgrep -P "$up" -f " decode --listen")
waddr=$(tr '\0' '\n' < /proc/"$router"/cmdline | sed -n 's/^--decode-workers=//p')
cpu() { awk '{print $14 + $15}' /proc/"$1"/stat; }  # user + system, clock ticks
tick=$(getconf CLK_TCK)
serve() { "$bin" bench serve --base-url "http://127.0.0.1:$port/v1" --model tiny-llama --vocab 384 \
  --concurrency 256 --input-len 108 --output-len 128 --ignore-eos "$@"; }
serve --num-prompts 256 >/dev/null  # warm-up
for r in $(seq 1 "$rounds"); do
  curl -s "http://$waddr/metrics" >"$log.m0"
  r0=$(cpu "$router"); w0=$(cpu "$worker")
  tps=$(serve --num-prompts 1024 --seed "$r" | awk '/Output token throughput/ {print $NF}')
  r1=$(cpu "$router"); w1=$(cpu "$worker")
  curl -s "http://$waddr/metrics" >"$log.m1"
  python3 - "$log.m0" "$log.m1" "$tps" "$((r1 - r0))" "$((w1 - w0))" "$tick" "$r" <<'PY'
import re, sys
def sums(path):
    v = {}
    for line in open(path):
        m = re.match(r'^(tandem_\w+?)(\{[^}]*\})? ([0-9.e+-]+)$', line.strip())
        if m:
            ph = re.search(r'(?:phase|part)="(\w+)"', m.group(2) or "")
            k = m.group(1) + (":" + ph.group(1) if ph else "")
            v[k] = v.get(k, 0.0) + float(m.group(3))
    return v
a, b = sums(sys.argv[1]), sums(sys.argv[2])
tps, rt, wt, tick, r = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
tokens = 1024 * 128
steps = b["tandem_engine_step_seconds_count"] - a["tandem_engine_step_seconds_count"]
us = lambda k: 1e6 * (b.get(k, 0.0) - a.get(k, 0.0)) / steps
phases = ", ".join(f"{p} {us('tandem_engine_phase_seconds_sum:' + p):.0f}" for p in ("schedule", "forward", "update", "outputs"))
phases += f"; dispatch {us('tandem_engine_between_steps_seconds_sum:dispatch'):.0f}"
print(f"round {r}: {tps:,.0f} output tok/s; router {1e6 * rt / tick / tokens:.1f} us CPU a token, "
      f"decode worker {1e6 * wt / tick / tokens:.1f} (engine included); {steps:.0f} steps, per step (us): {phases}")
PY
done
