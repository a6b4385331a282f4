#!/usr/bin/env bash
# The served path against the engine with this stop's tree: scripts/gpu/peer.sh's rounds alone.
set -u
export OUT=${OUT:-/tmp/out}
LLAMA=0 TABLE=0 ROUNDS=2 bash scripts/gpu/peer.sh run 2>&1 | tail -40
tar czf $OUT/logs.tgz -C $OUT peer
