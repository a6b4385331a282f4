#!/usr/bin/env bash
# The served path with fewer allocations and shared counters per output on the engine thread
# (courier streams keyed by number, one subscriber lookup per output, no id copies in the engine's
# outputs) against 1dea27f4's `tandem` (tandem-base.xz): served rounds (tandem up --device cuda
# defaults against bench engine, 2,048 requests of 108 + 128 at 256 streams, every core),
# alternating base, new, new, base.
source scripts/gpu/session.sh
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
cp .gpu/tandem/tandem .gpu/tandem/tandem-new
for tag in base-1 new-1 new-2 base-2; do
  cp .gpu/tandem/tandem-${tag%-*} .gpu/tandem/tandem
  echo "== $tag"
  served 1
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
finish
