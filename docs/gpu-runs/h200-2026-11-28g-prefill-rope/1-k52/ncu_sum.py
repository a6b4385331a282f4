#!/usr/bin/env python3
"""Sum an ncu --csv log's kernel durations by kernel name (all launches in the log)."""
import csv, io, re, sys
from collections import defaultdict
txt = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(txt) if l.startswith('"ID"'))
rows = list(csv.DictReader(io.StringIO("\n".join(txt[start:]))))
t = defaultdict(float); n = defaultdict(int); by = defaultdict(float)
for r in rows:
    if r["Metric Name"] != "gpu__time_duration.sum": continue
    k = re.sub(r"<.*>", "", r["Kernel Name"].split("(")[0]).strip()
    t[k] += float(r["Metric Value"].replace(",", "")) / 1e3; n[k] += 1
tot = sum(t.values())
print(f"kernels' sum {tot:.1f} us over {sum(n.values())} launches")
for k, v in sorted(t.items(), key=lambda x: -x[1]):
    print(f"{v:10.1f} us {100*v/tot:5.1f}%  x{n[k]:4d}  {v/n[k]:7.2f} us each  {k[:90]}")
