#!/usr/bin/env bash
# k131's binaries. Served rounds alternating glibc's default arenas and MALLOC_ARENA_MAX=2 for
# every process of the round (a step's outputs are built on the engine thread and freed on the
# runtime's threads; more arenas, more of that crossing), with every core and on cores 0-3.
source scripts/gpu/session.sh
for r in 1 2; do
  served 1; mv $L/served $L/served-all-default-$r; mv $L/peer.log $L/served-all-default-$r/
  MALLOC_ARENA_MAX=2 served 1; mv $L/served $L/served-all-arena2-$r; mv $L/peer.log $L/served-all-arena2-$r/
done
for r in 1 2; do
  for a in default arena2; do
    env=(); [ $a = arena2 ] && env=(MALLOC_ARENA_MAX=2)
    taskset -c 0-3 env "${env[@]}" bash -c "source scripts/gpu/session.sh >/dev/null; served 1"
    mv $L/served $L/served-4cores-$a-$r 2>/dev/null; mv $L/peer.log $L/served-4cores-$a-$r/ 2>/dev/null
  done
done
for f in $L/*/peer.log; do echo "$f"; grep -E "cores busy|tandem up, client|decode worker:" $f | cut -c1-250; done
finish
