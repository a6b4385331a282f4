#!/usr/bin/env bash
# One H100: served rounds with mimalloc as the `tandem` binary's allocator against the same tree
# on glibc's malloc (b58c4c2's binary, carried as tandem-base.xz), alternating, two rounds each
# time (SmolLM2 shape, random Q8_0 in f16, 2,048 requests of 108 + 128 at 256 streams).
source scripts/gpu/session.sh
cp .gpu/tandem/tandem .gpu/tandem/tandem-mi
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
for r in 1 2; do
  for v in mi base; do
    cp .gpu/tandem/tandem-$v .gpu/tandem/tandem
    echo "== $v (pass $r)"; served 2
    mv $L/served $L/served-$v-$r
  done
done
finish
