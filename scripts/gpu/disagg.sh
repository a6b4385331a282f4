#!/usr/bin/env bash
# Disaggregated serving on one two-GPU machine, KV pages GPU to GPU over NCCL: router + prefill
# worker (GPU 0) + decode worker (GPU 1), against a colocated worker (GPU 0), with the real model.
#
#   scripts/gpu/disagg.sh [MODEL] [TANDEM] [SECTIONS]
#     MODEL     a GGUF (default: the embedded default model)
#     TANDEM    the binary (default: .gpu/tandem/tandem)
#     SECTIONS  any of: greedy mixed kill tp (default: the first three)
#
# greedy  the same prompts (20 to ~3000 tokens) one after another through both topologies,
#         temperature 0, with log-probabilities: outputs compared token for token; where they
#         part, the colocated run's top-2 margin at that token is printed (a near-tie is < 0.05).
# mixed   steady short chats (256-token prompts, 128 tokens out, Poisson 8/s) plus 8000-token
#         prompts (Poisson 0.5/s), both `tandem bench serve` at once against each topology:
#         ITL p50/p99, TTFT p50/p99 and output tok/s of the chats, and whether ITL stays flat.
# tp      a tensor-parallel decode worker (GPUs 0 and 1, --tensor-parallel-size 2) fed by a
#         one-GPU prefill worker (GPU 0), KV pages over TCP in the whole model's layout (each side
#         re-shards by KV head), against the same TP=2 worker colocated: greedy outputs compared
#         token for token as in `greedy` (TP_MODEL, default tests/data/tiny-llama: 4 query and 2
#         KV heads, real tokenizer, 512 positions, so prompts stay under ~400 tokens: 1 to 4 notes).
# kill    the prefill worker stalls its link mid-transfer (fault injection) and is killed there:
#         how long the decode worker takes to notice, that the request still completes, that the
#         next requests are served, and that a restarted prefill worker gets a new link.
#
# Logs and JSON go to $OUT (default .gpu/out/disagg). NCCL_NVLS_ENABLE=0 is set (the H200
# hosts it was measured on need NVLink multicast off). Exit status 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/lib.sh
model="${1:-$HOME/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
tandem="${2:-.gpu/tandem/tandem}"
sections="${3:-greedy mixed kill}"
notes_max=140
out="${OUT:-.gpu/out}/disagg"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
port=18431 pport=50151 dport=50161 kport=50162
# Both topologies: a GPU-sized step budget (the default, 512, suits CPUs).
engine_flags=(--max-num-batched-tokens 2048 --gpu-memory-utilization 0.8)
fail=0
pids=()

now() { date +%s.%N; }

blocks_back() { # port name: every KV block of an idle worker is free (or an evictable cached block)
  sleep 1
  local m; m=$(curl -sf "http://127.0.0.1:$1/metrics")
  local free num
  free=$(echo "$m" | awk '/^tandem_kv_cache_free_blocks/ { print $NF }')
  num=$(echo "$m" | awk '/^tandem_kv_cache_num_blocks/ { print $NF }')
  if [ -n "$free" ] && [ "$free" = "$num" ]; then echo "$2: all $num KV blocks free when idle"; else echo "$2: $free of $num KV blocks free when idle: LEAK"; fail=1; fi
}

early() { # prefill log: pages shipped while their prompt was still being computed, of all
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '/pages shipped/ { for (i = 1; i <= NF; i++) { if ($i ~ /^pages=/) { split($i, a, "="); p += a[2] } if ($i ~ /^early_pages=/) { split($i, b, "="); e += b[2] } } } END { printf "%d of %d pages shipped while their prompt was still being computed", e, p }'
}

start_prefill() { # log-name [env...]
  env "${@:2}" "$tandem" prefill --model "$model" --device cuda --cuda-device 0 --kv-transport nccl \
    --listen 127.0.0.1:$pport "${engine_flags[@]}" > "$out/$1.log" 2>&1 &
  ppid_=$!
  pids+=("$ppid_")
  wait_healthy "http://127.0.0.1:$pport/health" "$ppid_" "$out/$1.log"
}

start_decode() { # log-name gpu transport [flags...]
  "$tandem" decode --model "$model" --device cuda --cuda-device "$2" --kv-transport "$3" \
    --listen 127.0.0.1:$dport --kv-listen 127.0.0.1:$kport "${engine_flags[@]}" "${@:4}" > "$out/$1.log" 2>&1 &
  dpid=$!
  pids+=("$dpid")
  wait_healthy "http://127.0.0.1:$dport/health" "$dpid" "$out/$1.log"
}

start_router() { # log-name [flags...]
  "$tandem" router --model "$model" --listen 127.0.0.1:$port --decode-workers 127.0.0.1:$dport "${@:2}" > "$out/$1.log" 2>&1 &
  rpid=$!
  pids+=("$rpid")
  wait_healthy "http://127.0.0.1:$port/health" "$rpid" "$out/$1.log"
}

stop_all() { # SIGTERM, then SIGKILL (and a note of what it was waiting in) after 20 s
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      echo "process $p ($(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-60)) did not exit within 20 s of SIGTERM; threads:"
      for t in /proc/$p/task/*; do echo "  $(cat $t/comm 2>/dev/null) $(cat $t/wchan 2>/dev/null)"; done | sort | uniq -c | head -20
      fail=1
      kill -9 "$p" 2>/dev/null
    fi
    wait "$p" 2>/dev/null
  done
  pids=()
}
trap stop_all EXIT

disaggregated() { # name-prefix [prefill env...]
  start_prefill "$1-prefill" "${@:2}" && start_decode "$1-decode" 1 nccl && start_router "$1-router" --prefill-workers 127.0.0.1:$pport
}

colocated() { # name-prefix
  start_decode "$1-decode" 0 tcp --colocated && start_router "$1-router"
}

# ---- greedy: token-for-token equality -------------------------------------------------------
greedy_client() { # answers-file
  python3 - "$port" "$notes_max" > "$1" <<'EOF'
import json, sys, urllib.request
port, notes_max = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=30).read())["data"][0]["id"]
topics = ["the history of the bicycle", "how tides work", "baking sourdough bread", "the life of honey bees",
          "building a wooden canoe", "the rules of chess", "volcanoes of Iceland", "the invention of printing"]
prompts = []
for i in range(32):
    t = topics[i % len(topics)]
    body = " ".join(f"Note {k} on {t}: the {k}-th observation recorded by the student in the afternoon was careful and precise." for k in range(1 + (i * i * 7) % notes_max))
    prompts.append(f"Request {i}. Here are notes about {t}. {body}\nA short summary of {t}:")
def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())
for i, p in enumerate(prompts):
    r = post({"model": model, "prompt": p, "max_tokens": 48, "temperature": 0, "logprobs": 2})
    c = r["choices"][0]
    lp = c["logprobs"]
    print(json.dumps({"i": i, "prompt_tokens": r["usage"]["prompt_tokens"], "text": c["text"], "tokens": lp["tokens"], "token_logprobs": lp["token_logprobs"], "top": [sorted(t.values(), reverse=True) for t in lp["top_logprobs"]]}))
EOF
}

greedy() {
  echo "== greedy: disaggregated (NCCL) vs colocated, 32 prompts one after another, 48 tokens each"
  if disaggregated greedy-disagg; then
    greedy_client "$out/greedy-disagg.jsonl" || { echo "disaggregated: a request failed"; fail=1; }
    blocks_back $dport "decode worker"; blocks_back $pport "prefill worker"
    echo "decode worker: $(grep -c 'remote prefill done' "$out/greedy-disagg-decode.log") remote prefills, $(grep -c 'device link to the prefill worker up' "$out/greedy-disagg-decode.log") link(s) made, $(grep -c 'remote prefill failed' "$out/greedy-disagg-decode.log") failed"
    grep -m1 'device link to the prefill worker up' "$out/greedy-disagg-decode.log"
    echo "prefill worker: $(early "$out/greedy-disagg-prefill.log")"
  else fail=1; fi
  stop_all
  if colocated greedy-coloc; then
    greedy_client "$out/greedy-coloc.jsonl" || { echo "colocated: a request failed"; fail=1; }
  else fail=1; fi
  stop_all
  compare_greedy "$out/greedy-disagg.jsonl" "$out/greedy-coloc.jsonl" || fail=1
}

compare_greedy() { # disaggregated-answers colocated-answers
  python3 - "$1" "$2" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
if len(a) != len(b) or not a:
    print(f"answer counts differ: {len(a)} vs {len(b)}"); sys.exit(1)
same = ties = real = 0
# Where both chose the same token: how far apart its log-probability is (a token id that
# renders as the same string as another would show here, not in the strings).
worst = 0.0
for x, y in zip(a, b):
    for s, t, p, q in zip(x["tokens"], y["tokens"], x["token_logprobs"], y["token_logprobs"]):
        if s != t:
            break
        worst = max(worst, abs(p - q))
    if x["tokens"] == y["tokens"]:
        same += 1
        continue
    k = next(i for i, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t) if any(s != t for s, t in zip(x["tokens"], y["tokens"])) else min(len(x["tokens"]), len(y["tokens"]))
    top = y["top"][k] if k < len(y["top"]) else []
    margin = top[0] - top[1] if len(top) > 1 else float("inf")
    tie = margin < 0.05
    ties += tie; real += not tie
    print(f"prompt {x['i']} ({x['prompt_tokens']} tokens) parts at token {k}: {x['tokens'][k:k+1]} vs {y['tokens'][k:k+1]}, colocated top-2 margin {margin:.4f} nats -> {'near-tie' if tie else 'REAL DIFFERENCE'}")
toks = sum(x["prompt_tokens"] for x in a)
print(f"greedy: {same}/{len(a)} identical token for token ({toks} prompt tokens in all), {ties} part at a near-tie, {real} differ otherwise; chosen tokens' log-probabilities differ by at most {worst:.4f} nats")
sys.exit(1 if real or worst > 0.05 else 0)
EOF
}

# ---- tp: TP=1 prefill -> TP=2 decode ---------------------------------------------------------
tp() {
  local saved="$model" saved_notes="$notes_max"
  model="${TP_MODEL:-tests/data/tiny-llama}" notes_max=4
  # Both workers share GPU 0: KV pools of a fixed size instead of a share of memory each.
  local flags=(--max-num-batched-tokens 2048 --kv-cache-memory 1GiB)
  echo "== tp: disaggregated TP=1 prefill (GPU 0) -> TP=2 decode (GPUs 0+1) vs colocated TP=2, $model, 32 prompts, 48 tokens each"
  "$tandem" prefill --model "$model" --device cuda --cuda-device 0 --kv-transport tcp \
    --listen 127.0.0.1:$pport "${flags[@]}" > "$out/tp-disagg-prefill.log" 2>&1 &
  ppid_=$!; pids+=("$ppid_")
  if wait_healthy "http://127.0.0.1:$pport/health" "$ppid_" "$out/tp-disagg-prefill.log"; then
    "$tandem" decode --model "$model" --device cuda --cuda-device 0 --tensor-parallel-size 2 --kv-transport tcp \
      --listen 127.0.0.1:$dport --kv-listen 127.0.0.1:$kport "${flags[@]}" > "$out/tp-disagg-decode.log" 2>&1 &
    dpid=$!; pids+=("$dpid")
    if wait_healthy "http://127.0.0.1:$dport/health" "$dpid" "$out/tp-disagg-decode.log" && start_router tp-disagg-router --prefill-workers 127.0.0.1:$pport; then
      greedy_client "$out/tp-disagg.jsonl" || { echo "disaggregated TP: a request failed"; fail=1; }
      blocks_back $dport "decode worker (TP=2)"; blocks_back $pport "prefill worker (TP=1)"
      echo "decode worker: $(grep -c 'remote prefill done' "$out/tp-disagg-decode.log") remote prefills, $(grep -c 'remote prefill failed' "$out/tp-disagg-decode.log") failed"
      grep -m1 -i 'model on the GPU' "$out/tp-disagg-decode.log"
    else fail=1; fi
  else fail=1; fi
  stop_all
  "$tandem" decode --model "$model" --device cuda --cuda-device 0 --tensor-parallel-size 2 --colocated \
    --listen 127.0.0.1:$dport --kv-listen 127.0.0.1:$kport "${flags[@]}" > "$out/tp-coloc-decode.log" 2>&1 &
  dpid=$!; pids+=("$dpid")
  if wait_healthy "http://127.0.0.1:$dport/health" "$dpid" "$out/tp-coloc-decode.log" && start_router tp-coloc-router; then
    greedy_client "$out/tp-coloc.jsonl" || { echo "colocated TP: a request failed"; fail=1; }
  else fail=1; fi
  stop_all
  compare_greedy "$out/tp-disagg.jsonl" "$out/tp-coloc.jsonl" || fail=1
  model="$saved" notes_max="$saved_notes"
}

# ---- mixed load: ITL of short chats next to 8k-token prompts --------------------------------
mixed_run() { # name
  local base="http://127.0.0.1:$port/v1"
  # Warm-up (the first request to a prefill worker also sets up the device link, once).
  "$tandem" bench serve --base-url "$base" --workload random --input-len 256 --output-len 8 --num-prompts 4 --vocab 49000 --seed 9 --quiet > /dev/null 2>&1
  "$tandem" bench serve --base-url "$base" --workload random --input-len 256 --output-len 128 --num-prompts 240 \
    --request-rate 8 --ignore-eos --vocab 49000 --seed 1 --quiet --label "$1 chats" --json "$out/mixed-$1-chats.json" > "$out/mixed-$1-chats.txt" 2>&1 &
  local c=$!
  "$tandem" bench serve --base-url "$base" --workload random --input-len 8000 --output-len 16 --num-prompts 15 \
    --request-rate 0.5 --ignore-eos --vocab 49000 --seed 2 --quiet --label "$1 long" --json "$out/mixed-$1-long.json" > "$out/mixed-$1-long.txt" 2>&1 &
  local l=$!
  wait "$c" || fail=1
  wait "$l" || fail=1
}

mixed() {
  echo "== mixed load: short chats (256 in / 128 out, 8 req/s) + 8000-token prompts (0.5 req/s), 30 s, after a warm-up"
  if disaggregated mixed-disagg; then mixed_run disagg; blocks_back $dport "decode worker"; blocks_back $pport "prefill worker"; else fail=1; fi
  echo "decode worker: $(grep -c 'remote prefill done' "$out/mixed-disagg-decode.log") remote prefills, $(grep -c 'remote prefill failed' "$out/mixed-disagg-decode.log") failed; prefill worker: $(early "$out/mixed-disagg-prefill.log")"
  stop_all
  if colocated mixed-coloc; then mixed_run coloc; else fail=1; fi
  stop_all
  python3 - "$out" <<'EOF' || fail=1
import json, sys, os
d = sys.argv[1]
rows = {}
for name in ("disagg", "coloc"):
    c = json.load(open(os.path.join(d, f"mixed-{name}-chats.json")))["result"]
    l = json.load(open(os.path.join(d, f"mixed-{name}-long.json")))["result"]
    rows[name] = (c, l)
    print(f"{name:>7}: chats {c['completed']} done / {c['failed']} failed, ITL p50 {c['itl']['median_ms']:.2f} ms p99 {c['itl']['p99_ms']:.2f} ms, "
          f"TTFT p50 {c['ttft']['median_ms']:.1f} ms p99 {c['ttft']['p99_ms']:.1f} ms, output {c['output_throughput']:.0f} tok/s; "
          f"long prompts {l['completed']} done / {l['failed']} failed, TTFT p50 {l['ttft']['median_ms']:.1f} ms p99 {l['ttft']['p99_ms']:.1f} ms, output {l['output_throughput']:.0f} tok/s")
(dc, _), (cc, _) = rows["disagg"], rows["coloc"]
flat = lambda c: c["itl"]["p99_ms"] / max(c["itl"]["median_ms"], 1e-9)
print(f"ITL p99/p50: disaggregated {flat(dc):.2f}, colocated {flat(cc):.2f}; ITL p99 colocated / disaggregated = {cc['itl']['p99_ms'] / dc['itl']['p99_ms']:.2f}x")
print("flat ITL (p99 within 1.5x of p50) with disaggregation:", "yes" if flat(dc) <= 1.5 else "no")
sys.exit(1 if dc["failed"] or cc["failed"] else 0)
EOF
}

# ---- kill the prefill worker mid-transfer ---------------------------------------------------
kill_test() {
  echo "== kill: the prefill worker stalls mid-transfer (after 16 pages) and is killed there"
  disaggregated kill TANDEM_FAULT_INJECT=stall-after-pages=16 || { fail=1; return; }
  local prefill_pid=$ppid_
  python3 - "$port" > "$out/kill-client.jsonl" 2>&1 <<'EOF' &
import json, sys, time, urllib.request
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=30).read())["data"][0]["id"]
p = "Background. " + " ".join(f"Fact {k}: the survey team measured the river at station {k} and wrote it down." for k in range(80)) + "\nSummary:"
t = time.time()
req = urllib.request.Request(base + "/v1/completions", json.dumps({"model": model, "prompt": p, "max_tokens": 16, "temperature": 0}).encode(), {"Content-Type": "application/json"})
try:
    r = json.loads(urllib.request.urlopen(req, timeout=120).read())
    print(json.dumps({"ok": True, "end": time.time(), "seconds": time.time() - t, "prompt_tokens": r["usage"]["prompt_tokens"], "text": r["choices"][0]["text"]}))
except Exception as e:
    print(json.dumps({"ok": False, "end": time.time(), "error": str(e)}))
EOF
  local client=$!
  local stalled=""
  for _ in $(seq 1 600); do
    grep -q "the page link stalls" "$out/kill-prefill.log" && { stalled=1; break; }
    sleep 0.05
  done
  [ -n "$stalled" ] || { echo "the prefill worker never reached the stall"; fail=1; }
  local t_kill; t_kill=$(now)
  kill -9 "$prefill_pid"
  local t_detect=""
  for _ in $(seq 1 2000); do
    grep -q "remote prefill failed" "$out/kill-decode.log" && { t_detect=$(now); break; }
    sleep 0.005
  done
  wait "$client"
  cat "$out/kill-client.jsonl"
  python3 - "$t_kill" "${t_detect:-nan}" "$out/kill-client.jsonl" <<'EOF' || fail=1
import json, sys
k, d = float(sys.argv[1]), float(sys.argv[2])
r = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
print(f"kill -9 of the prefill worker mid-transfer: the decode worker noticed after {1e3 * (d - k):.0f} ms (log poll, ~5 ms resolution); "
      f"the request {'completed (recomputed on the decode worker) ' + str(round(1e3 * (r['end'] - k))) + ' ms after the kill' if r['ok'] else 'FAILED: ' + r.get('error', '')}")
sys.exit(0 if r["ok"] and d == d else 1)
EOF
  grep -m3 "remote prefill failed\|device link failed\|page link closed" "$out/kill-decode.log" | cut -c1-300
  # The next requests, with the prefill worker gone, then restarted without the fault.
  greedy_client "$out/kill-after.jsonl" 2>&1 | tail -1 && echo "after the kill: $(wc -l < "$out/kill-after.jsonl") requests served with the prefill worker gone" || { echo "requests failed after the kill"; fail=1; }
  local before; before=$(grep -c 'remote prefill done' "$out/kill-decode.log")
  start_prefill kill-prefill2 || { fail=1; return; }
  sleep 2
  greedy_client "$out/kill-restarted.jsonl" > /dev/null 2>&1 || { echo "requests failed after the restart"; fail=1; }
  local after; after=$(grep -c 'remote prefill done' "$out/kill-decode.log")
  blocks_back $dport "decode worker (after the kill and the restart)"; blocks_back $pport "restarted prefill worker"
  echo "restarted prefill worker: $((after - before)) remote prefills over $(grep -c 'device link to the prefill worker up' "$out/kill-decode.log") link(s) made in all"
  [ $((after - before)) -gt 0 ] || { echo "no remote prefill after the restart"; fail=1; }
  stop_all
}

for s in $sections; do
  case "$s" in
    greedy) greedy ;;
    mixed) mixed ;;
    kill) kill_test ;;
    tp) tp ;;
    *) echo "unknown section $s"; fail=1 ;;
  esac
done
echo "disagg.sh: $([ $fail = 0 ] && echo 'all sections passed' || echo 'FAILED')"
exit "$fail"
