#!/usr/bin/env bash
# k131's binaries. Served rounds alternating glibc's default thread cache and a deep one
# (GLIBC_TUNABLES=glibc.malloc.tcache_count=1024 for every process of the round): a step's
# outputs are allocated on the engine thread and freed on the runtime's threads, whose
# 7-entry caches overflow into the engine thread's arena under its lock; deep caches keep those
# frees on the runtime's threads, which reuse them for their own messages.
source scripts/gpu/session.sh
ldd --version | head -1
T=GLIBC_TUNABLES=glibc.malloc.tcache_count=1024
for r in 1 2; do
  served 1; mv $L/served $L/served-all-default-$r; mv $L/peer.log $L/served-all-default-$r/
  env $T bash -c "source scripts/gpu/session.sh >/dev/null; served 1"
  mv $L/served $L/served-all-tcache-$r; mv $L/peer.log $L/served-all-tcache-$r/
done
for a in default tcache; do
  env=(); [ $a = tcache ] && env=($T)
  taskset -c 0-3 env "${env[@]}" bash -c "source scripts/gpu/session.sh >/dev/null; served 1"
  mv $L/served $L/served-4cores-$a 2>/dev/null; mv $L/peer.log $L/served-4cores-$a/ 2>/dev/null
done
for f in $L/*/peer.log; do echo "$f"; grep -E "cores busy|tandem up, client|decode worker:" $f | cut -c1-250; done
finish
