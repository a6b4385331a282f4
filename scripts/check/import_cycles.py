#!/usr/bin/env python3
"""Finds import cycles among the files of each crate: an edge a -> b when file a names
`crate::b...` (in a `use` or a path), or an item the crate root re-exports from b. A parent
declaring `mod b;` is not an edge (a parent owning a child is not a dependency), nor is a test
module's use. Prints every cycle (as a strongly connected component) and exits 1 if any.

    python3 scripts/check/import_cycles.py [CRATE_DIR ...]   (default: every workspace crate)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRATES = ["engine", "router", "worker", "prefill-svc", "decode-svc", "kv-transfer", "operator", "cli", "proto", "cuda"]


def modules(src):
    """Maps module path (e.g. 'backend::cpu::ops') to file, for every .rs file under src."""
    out = {}
    for d, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(d, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                rel = []
            out["::".join(rel)] = os.path.join(d, f)
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def root_reexports(mods):
    """Items the crate root re-exports (`pub use module::{A, B as C};`), mapped to their module."""
    root = mods.get("")
    out = {}
    if not root:
        return out
    text = strip_comments(open(root).read())
    for m in re.finditer(r"pub use ((?:\w+::)+)(\{[^}]*\}|\w+(?:\s+as\s+\w+)?)\s*;", text):
        path = m.group(1).rstrip(":").split("::")
        module = next(("::".join(path[:n]) for n in range(len(path), 0, -1) if "::".join(path[:n]) in mods), None)
        if module is None:
            continue
        for item in m.group(2).strip("{}").split(","):
            name = item.strip().split(" as ")[-1].strip()
            if name:
                out[name] = module
    return out


def resolve(path, mods, roots):
    """The module of this crate that `crate::<path>` depends on, if any."""
    parts = path.split("::")
    for n in range(len(parts), 0, -1):
        cand = "::".join(parts[:n])
        if cand in mods:
            return cand
    return roots.get(parts[0])


def deps(path, mods, me, roots):
    text = strip_comments(open(path).read())
    # Test modules may reach anywhere in their crate.
    text = re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)[0]
    found = set()
    for m in re.finditer(r"crate::((?:\w+::)*\w+)", text):
        dep = resolve(m.group(1), mods, roots)
        if dep is not None:
            found.add(dep)
    # `use crate::{a::X, B};`
    for m in re.finditer(r"crate::\{([^}]*)\}", text):
        for item in m.group(1).split(","):
            dep = resolve(item.strip().split(" as ")[0].strip(), mods, roots) if item.strip() else None
            if dep is not None:
                found.add(dep)
    # `use super::x` from a child file.
    parent = me.rsplit("::", 1)[0] if "::" in me else ""
    for m in re.finditer(r"\bsuper::(\w+)", text):
        cand = f"{parent}::{m.group(1)}" if parent else m.group(1)
        if cand in mods:
            found.add(cand)
    found.discard(me)
    # A module's own descendants and ancestors are structure, not dependencies.
    return {d for d in found if not d.startswith(me + "::") and not (me.startswith(d + "::") or d == "")}


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    crates = sys.argv[1:] or CRATES
    bad = 0
    for c in crates:
        src = os.path.join(ROOT, c, "src")
        if not os.path.isdir(src):
            continue
        mods = modules(src)
        roots = root_reexports(mods)
        graph = {m: deps(p, mods, m, roots) for m, p in mods.items() if m}
        for comp in sccs(graph):
            if len(comp) > 1:
                bad += 1
                print(f"{c}: import cycle among " + ", ".join(sorted(comp)))
                for m in sorted(comp):
                    print(f"    {m} -> " + ", ".join(sorted(d for d in graph[m] if d in comp)))
    if bad:
        print(f"{bad} import cycle(s)")
        sys.exit(1)
    print("no import cycles in " + ", ".join(crates))


if __name__ == "__main__":
    main()
