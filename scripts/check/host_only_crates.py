"""Checks that every crate built only for the host on Linux (proc macros, build scripts and what
only they use) is named at opt-level 0 under `[profile.dev.package]` in the workspace's
Cargo.toml.

Cargo ranks `[profile.dev.package."*"]` (opt-level 3 here, so the tests run the model's
dependencies optimised) above `[profile.dev.build-override]`, so build-time code would otherwise
compile at opt-level 3 too, for no gain: it runs once per build. A crate is host-only when no path
of normal or dev dependencies from a workspace member reaches it without passing through a proc
macro.

Usage: python3 scripts/check/host_only_crates.py [--list]
  exits 1 naming the host-only crates Cargo.toml does not name at opt-level 0 (names there that
  are not host-only, such as the large generated types named on purpose, are not checked);
  --list prints the host-only crates and exits 0.
"""
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = "x86_64-unknown-linux-gnu"


def host_only_crates() -> set[str]:
    """Names of the packages only the host builds (none that the target also builds)."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--filter-platform", TARGET],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    def proc_macro(pid: str) -> bool:
        return any("proc-macro" in t["kind"] for t in packages[pid]["targets"])

    target, stack = set(), list(meta["workspace_members"])
    while stack:
        pid = stack.pop()
        if pid in target:
            continue
        target.add(pid)
        for dep in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if kinds & {None, "dev"} and not proc_macro(dep["pkg"]):
                stack.append(dep["pkg"])
    target_names = {packages[p]["name"] for p in target}
    # A name the target also builds (another version) cannot be told apart in a profile.
    return {packages[p]["name"] for p in set(nodes) - target} - target_names


def named_at_opt0() -> set[str]:
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    packages = manifest["profile"]["dev"].get("package", {})
    return {name for name, prof in packages.items() if prof.get("opt-level") == 0}


def main() -> int:
    host = host_only_crates()
    if "--list" in sys.argv[1:]:
        print("\n".join(sorted(host)))
        return 0
    named = named_at_opt0()
    missing = sorted(host - named)
    if missing:
        print("host-only crates not at opt-level 0 in Cargo.toml [profile.dev.package]:")
        print("  " + " ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
