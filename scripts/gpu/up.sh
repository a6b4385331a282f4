#!/usr/bin/env bash
# `tandem up --device cuda` on one GPU: the disaggregated topology (router, prefill worker, decode
# worker, KV pages over TCP between the two GPU processes, each with its share of GPU memory) and
# the colocated one, the same greedy requests through both, outputs compared token for token.
#
#   scripts/gpu/up.sh [MODEL] [TANDEM]     MODEL: a GGUF (default: the embedded default model)
#                                          TANDEM: the binary (default: .gpu/tandem/tandem)
# DEVICE=cpu runs the same comparison on the CPU backend.
# Prints each topology's answers and whether they agree; exit status 1 when a request failed or
# the outputs differ.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/lib.sh
model="${1:-$HOME/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
tandem="${2:-.gpu/tandem/tandem}"
out="${OUT:-.gpu/out}"
mkdir -p "$out"
port=18431

serve() { # topology-flags... ; leaves the server running, its pid in $pid
  "$tandem" up --device "${DEVICE:-cuda}" --model "$model" --port "$port" "$@" > "$out/up-$name.log" 2>&1 &
  pid=$!
  wait_healthy "http://127.0.0.1:$port/health" "$pid" "$out/up-$name.log"
}

ask() { # writes one JSON line per request to $out/answers-$name.jsonl
  python3 - "$port" > "$out/answers-$name.jsonl" <<'EOF'
import json, sys, urllib.request
port = sys.argv[1]
prompts = [
    "The history of the bicycle begins in the early nineteenth century, when inventors in Germany and France",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed iteratively.\"\"\"\n    a, b = 0, 1\n",
    "A recipe for bread needs flour, water, salt and yeast. First, mix the flour and the salt in a large bowl, then",
    "Tides are caused mainly by the gravitational pull of the Moon on the oceans of the Earth. Because",
]
model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30).read())["data"][0]["id"]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()
for p in prompts:
    r = json.loads(post("/v1/completions", {"model": model, "prompt": p, "max_tokens": 32, "temperature": 0}))
    c = r["choices"][0]
    print(json.dumps({"prompt": p[:30], "text": c["text"]}))
# A streamed chat completion: the deltas joined.
body = {"model": model, "messages": [{"role": "user", "content": "Name three primary colors and say why they are called primary."}], "max_tokens": 40, "temperature": 0, "stream": True}
text = ""
for line in post("/v1/chat/completions", body).splitlines():
    if line.startswith("data: ") and line != "data: [DONE]":
        d = json.loads(line[6:])["choices"][0]["delta"]
        text += d.get("content") or ""
print(json.dumps({"prompt": "chat (streamed)", "text": text}))
EOF
}

fail=0
for name in disaggregated colocated; do
  flags=(--disaggregated --gpu-memory-utilization 0.4)
  [ "$name" = colocated ] && flags=(--colocated --gpu-memory-utilization 0.8)
  if serve "${flags[@]}"; then
    ask || { echo "$name: a request failed"; fail=1; }
  else
    fail=1
  fi
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  echo "== $name"; cat "$out/answers-$name.jsonl" 2>/dev/null
done
if [ -s "$out/answers-colocated.jsonl" ] && cmp -s "$out/answers-disaggregated.jsonl" "$out/answers-colocated.jsonl"; then
  echo "disaggregated and colocated answers are identical ($(wc -l < "$out/answers-colocated.jsonl") requests)"
else
  echo "answers differ"; diff "$out/answers-disaggregated.jsonl" "$out/answers-colocated.jsonl"; fail=1
fi
exit "$fail"
