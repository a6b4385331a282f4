#!/usr/bin/env bash
# Speculative decoding (n-gram, and the self-speculative draft of the model's first 20 layers)
# against plain decoding on this machine: single-stream and
# 8-stream decode tok/s on a repetitive code workload and on free chat, 128 output tokens,
# median of 5 alternating runs each, with acceptance rates. Prints one line per case and the speed-ups.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tandem-cli >&2
bin=target/release/tandem
runs="${RUNS:-5}"
python3 - "$bin" "$runs" <<'PY'
import json, statistics, subprocess, sys
bin, runs = sys.argv[1], int(sys.argv[2])
def once(w, n, spec):
    out = subprocess.run([bin, "bench", "engine", "--workload", w, "--num-prompts", str(n), "--output-len", "128",
                          "--min-output-len", "128", "--speculative", spec, "--draft-layers", "20", "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
for w in ["code", "chat"]:
    for n in [1, 8]:
        res = {}
        # Alternate the two so the host's drift hits both alike.
        specs = ["none", "ngram", "self-draft"]
        both = [tuple(once(w, n, sp) for sp in specs) for _ in range(runs)]
        for j, spec in enumerate(specs):
            rs = [b[j] for b in both]
            tps = statistics.median(r["decode_tok_per_s"] for r in rs)
            drafts = sum(r["spec_draft_tokens"] for r in rs); acc = sum(r["spec_accepted_tokens"] for r in rs)
            res[spec] = tps
            print(f"{w:5} streams={n} {spec:10} decode {tps:7.1f} tok/s  acceptance {acc / drafts if drafts else 0:.3f} ({acc}/{drafts} draft tokens over {runs} runs)")
        print(f"{w:5} streams={n} speed-up ngram {res['ngram'] / res['none']:.2f}x, self-draft {res['self-draft'] / res['none']:.2f}x")
PY
