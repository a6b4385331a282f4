#!/usr/bin/env bash
# One NVIDIA H200: the served path against the engine (scripts/gpu/peer.sh's rounds alone: the
# SmolLM2-135M shape, random weights in a Q8_0 file, 1,024 requests of 108 + 128 tokens, 256 in
# flight, client sharing the cores) with programmatic dependent launch (default) and without
# (TANDEM_PDL=off given to bench engine and tandem up alike), two rounds each.
set -u
base=/tmp/out; mkdir -p $base
for v in on off; do
  if [ $v = off ]; then export TANDEM_PDL=off; else unset TANDEM_PDL; fi
  OUT=$base/$v LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared bash scripts/gpu/peer.sh run 2>&1 | tail -12 | sed "s/^/$v: /"
done
tar czf $OUT/logs.tgz -C $base on/peer off/peer
