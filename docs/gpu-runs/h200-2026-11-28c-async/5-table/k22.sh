#!/usr/bin/env bash
# Issue 30's table on this tree: llama.cpp's CUDA server (built here from the staged sdist) and
# `tandem up --device cuda` (defaults, then --disaggregated) under the same client.
set -u
export OUT=${OUT:-/tmp/out}
BUILD_LIMIT=330 bash scripts/gpu/peer.sh run 2>&1 | tail -40
for f in $OUT/peer/*-up-*.log $OUT/peer/up-*.log; do [ -f "$f" ] && tail -n 20 "$f" > "$f.t" && mv "$f.t" "$f"; done
tar czf $OUT/logs.tgz -C $OUT peer
