#!/usr/bin/env bash
# The served path against the engine on the final scheduler (ending sequences released early), with async scheduling and without (--no-async-scheduling
# given to both bench engine and tandem up): scripts/gpu/peer.sh's rounds alone.
set -u
export OUT=${OUT:-/tmp/out}
LLAMA=0 TABLE=0 ROUNDS=3 VARIANTS="default no-async-scheduling" bash scripts/gpu/peer.sh run 2>&1 | tail -40
tar czf $OUT/logs.tgz -C $OUT peer
