#!/usr/bin/env python3
"""Large-prompt admission: the router's memory and a normal request's latency while three
20 MB prompts (under the 32 MiB body limit) arrive at once.

Starts `tandem up` (disaggregated, on a free port), samples the router's resident memory every
20 ms, sends three 20 MB completion prompts concurrently with one small request, and prints the
router's RSS before, at its peak and after, the small request's latency and what the large ones
got back. Exits non-zero when the router's peak RSS reaches 300 MB or the small request takes
1 s or more (the goals of the hostile-load issue).

    python3 scripts/bench/large_prompts.py [--tandem target/release/tandem] [--mb 20] [--n 3]
"""
import argparse
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(p), cmd[1].decode() if len(cmd) > 1 else ""))
    return out


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def post(api, body, timeout=120):
    req = urllib.request.Request(f"http://{api}/v1/completions", body, {"Content-Type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            code, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        code, text = e.code, e.read().decode()
    return code, text, time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="target/release/tandem")
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--n", type=int, default=3)
    a = ap.parse_args()
    up = subprocess.Popen([a.tandem, "up", "--port", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        api = None
        for line in up.stdout:
            if line.startswith("TANDEM_READY up "):
                api = line.split()[2]
                break
        assert api, "tandem up did not start"
        model = json.load(urllib.request.urlopen(f"http://{api}/v1/models"))["data"][0]["id"]
        router = next(p for p, role in children(up.pid) if role == "router")
        small = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
        post(api, small)  # warm
        words = "lorem ipsum "
        big = json.dumps({"model": model, "prompt": words * (a.mb * 1_000_000 // len(words) + 1), "max_tokens": 4}).encode()
        before = rss_mb(router)
        peak = [before]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mb(router))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        results = [None] * a.n
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(api, big))) for i in range(a.n)]
        for t in threads:
            t.start()
        time.sleep(0.05)  # the large bodies are on their way
        code, text, small_s = post(api, small)
        for t in threads:
            t.join()
        time.sleep(1.0)
        stop.set()
        sampler.join()
        after = rss_mb(router)
        print(f"CPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
        print(f"{a.n} concurrent prompts of {len(big) / 1e6:.1f} MB; router RSS before {before:.0f} MB, peak {peak[0]:.0f} MB, 1 s after {after:.0f} MB")
        print(f"small request: HTTP {code} in {small_s * 1000:.0f} ms")
        for i, (c, t, s) in enumerate(results):
            msg = json.loads(t).get("error", {}).get("message", "") if c != 200 else "served"
            print(f"large prompt {i}: HTTP {c} in {s * 1000:.0f} ms: {msg[:120]}")
        ok = peak[0] < 300 and small_s < 1.0 and code == 200
        print("goals (peak RSS < 300 MB, small request < 1 s):", "met" if ok else "MISSED")
        raise SystemExit(0 if ok else 1)
    finally:
        up.terminate()
        up.wait(timeout=30)


if __name__ == "__main__":
    main()
