#!/usr/bin/env python3
"""A served run's steps by kind, from a worker's step log (TANDEM_STEP_LOG, worker/src/step_log.rs):
the classes `tandem bench engine` prints for an offline run (steps with prompts, decode-only
steps by rows), each with its steps' wall time (from one step's tokens to the next's), the
device's own time and the engine thread's time before them; then how the run's window splits
into the time before the first step, stepping, and after the last.

    step_log.py STEPS.jsonl [T0 T1]   T0/T1: the run's start and end, Unix seconds
"""
import json
import sys

CLASSES = [(16, "decode 1-16"), (64, "decode 17-64"), (128, "decode 65-128"), (256, "decode 129-256"), (10**9, "decode 257+")]


def main():
    lines = open(sys.argv[1]).read().splitlines()
    start = json.loads(lines[0])["start_unix"]
    recs = [json.loads(l) for l in lines[1:] if l.strip()]
    t0 = float(sys.argv[2]) - start if len(sys.argv) > 3 else float("-inf")
    t1 = float(sys.argv[3]) - start if len(sys.argv) > 3 else float("inf")
    recs = [r for r in recs if r["launched"] >= t0 and r["collected"] <= t1]
    if not recs:
        print("  no steps in the window")
        return
    names = ["with prompts"] + [c[1] for c in CLASSES]
    cls = {n: dict(steps=0, prompt=0, rows=0, wall=0.0, device=0.0, between=0.0) for n in names}
    # Each step's wall time: from the tokens of the step before (or its own launch, when the
    # engine had nothing to run in between: the client not sending yet) to its own. The time
    # the engine waited for work is counted apart.
    walls, last, waited = [], recs[0]["launched"], 0.0
    for r in recs:
        waited += max(r["launched"] - last, 0.0)
        walls.append((max(r["collected"] - max(last, r["launched"]), 0.0), r))
        last = max(last, r["collected"])
    for w, r in walls:
        n = "with prompts" if r["prompt_tokens"] else next(c[1] for c in CLASSES if r["decode_rows"] <= c[0])
        c = cls[n]
        c["steps"] += 1
        c["prompt"] += r["prompt_tokens"]
        c["rows"] += r["decode_rows"]
        c["wall"] += w
        c["device"] += r.get("device") or 0.0
        c["between"] += r.get("jobs", 0.0) + r.get("dispatch", 0.0)
    for n in names:
        c = cls[n]
        if not c["steps"]:
            continue
        s = c["steps"]
        print(f"  {n:<16} {s:5} steps ({c['prompt']} prompt tokens, {c['rows']} decode rows, {c['rows'] / s:.0f} a step): "
              f"wall {c['wall']:.3f} s ({1e3 * c['wall'] / s:.2f} ms a step), device {1e3 * c['device'] / s:.2f} ms a step, "
              f"engine thread's jobs + dispatch {1e6 * c['between'] / s:.0f} µs a step")
    # Decode-only steps of 129-256 rows by their rows' mean context (the KV each row reads):
    # device time against context, to compare like with like between runs.
    by = {}
    for r in recs:
        if not r["prompt_tokens"] and 128 < r["decode_rows"] <= 256 and r.get("device"):
            by.setdefault(int(r["decode_positions"] / r["decode_rows"] // 32) * 32, []).append(r["device"])
    if by:
        print("  decode 129-256 by mean context, device µs a step: " + ", ".join(
            f"{k}-{k + 31}: {1e6 * sum(v) / len(v):.0f} ({len(v)})" for k, v in sorted(by.items())))
    # The steps that added most wall time, each with the device's own time and what it computed:
    # a step far longer than its device time waited on the host (eager launches, a graph's
    # capture, the engine thread's jobs).
    walls.sort(key=lambda w: -w[0])
    print("  slowest steps (wall / device ms, prompt tokens + decode rows): " + ", ".join(
        f"{1e3 * w:.1f} / {1e3 * (r.get('device') or 0.0):.1f} ({r['prompt_tokens']} + {r['decode_rows']})"
        for w, r in walls[:12]))
    if len(sys.argv) > 3:
        first, end = recs[0]["launched"], max(r["collected"] for r in recs)
        print(f"  window {t1 - t0:.3f} s: {first - t0:.3f} s before the first step, {end - first:.3f} s from it to the last "
              f"tokens ({waited:.3f} s of it with nothing to run), {t1 - end:.3f} s after")


if __name__ == "__main__":
    main()
