#!/usr/bin/env python3
"""Where one decode step's GPU time goes, kernel by kernel.

Runs `tandem-gpu step CONFIG BATCH CONTEXT` under Nsight Compute with collection off until the
tool's profiler range (its last four graph replays), reading each kernel's duration and DRAM
bytes, and prints per kernel name: launches per step, time per step, share of the kernels' sum,
bytes moved and the bandwidth they reached. The step's graph-replay time (printed by the tool,
without the profiler) minus the kernels' sum is what the step spends between kernels.

    python3 scripts/gpu/step_kernels.py --bin .gpu/bin/tandem-gpu cuda/configs/qwen3-0.6b.json 64 100-2048

Nsight Compute runs each kernel alone (serialised), with the clocks and caches left as they are
(`--clock-control none --cache-control none`), so a kernel's time here is its own, without
overlap with its neighbours. Needs `ncu` (on the device hosts: /usr/local/cuda/bin/ncu, as root).
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys
from collections import defaultdict

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


def short(name: str) -> str:
    """A kernel's name without its parameter list and template arguments."""
    name = name.split("(")[0]
    name = re.sub(r"<.*>", "", name)
    return name.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".gpu/bin/tandem-gpu")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "/usr/local/cuda/bin/ncu"))
    ap.add_argument("config")
    ap.add_argument("batch")
    ap.add_argument("context", nargs="?", default="1024")
    a = ap.parse_args()
    cmd = [a.ncu, "--profile-from-start", "off", "--clock-control", "none", "--cache-control",
           "none", "--print-units", "base", "--csv", "--metrics", METRICS,
           a.bin, "step", a.config, a.batch, a.context]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    for l in lines:
        if l.startswith("["):
            print(l)
    rows = [l for l in lines if l.startswith('"')]
    if out.returncode != 0 or not rows:
        sys.stdout.write(out.stdout[-4000:])
        sys.stderr.write(out.stderr[-4000:])
        return 1
    per = defaultdict(lambda: {"ns": 0.0, "rd": 0.0, "wr": 0.0, "ids": set()})
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        k = per[short(r["Kernel Name"])]
        k["ids"].add(r["ID"])
        v = float(r["Metric Value"].replace(",", ""))
        k[{"gpu__time_duration.sum": "ns", "dram__bytes_read.sum": "rd",
           "dram__bytes_write.sum": "wr"}[r["Metric Name"]]] += v
    steps = max((len(k["ids"]) for n, k in per.items() if n == "embed"), default=1)
    total = sum(k["ns"] for k in per.values()) / steps
    print(f"{steps} steps profiled; kernels' sum {total / 1e3:.1f} us a step")
    print(f"{'kernel':<44} {'per step':>8} {'us/step':>9} {'share':>6} {'MB/step':>9} {'GB/s':>7}")
    for n, k in sorted(per.items(), key=lambda kv: -kv[1]["ns"]):
        ns, mb = k["ns"] / steps, (k["rd"] + k["wr"]) / steps / 1e6
        calls = len(k["ids"]) / steps
        print(f"{n[:44]:<44} {calls:>8.1f} {ns / 1e3:>9.1f} {100 * ns / total:>5.1f}% "
              f"{mb:>9.1f} {mb * 1e6 / ns if ns else 0:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
