#!/usr/bin/env bash
# Finished requests' outputs at once (TANDEM_DISPATCH_FINISHED_AT_ONCE=1) against the defaults,
# served rounds alternating on the k126 machine: three pairs on every core, three pairs with the
# engine, the server and the client all on cores 0-3 (a host with less room).
source scripts/gpu/session.sh
for r in 1 2 3; do
  served 1; mv $L/served $L/served-default-$r; mv $L/peer.log $L/served-default-$r/
  TANDEM_DISPATCH_FINISHED_AT_ONCE=1 served 1; mv $L/served $L/served-atonce-$r; mv $L/peer.log $L/served-atonce-$r/
done
for r in 1 2 3; do
  echo "== 4 cores, defaults (pass $r)"; taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"; mv $L/served $L/served-4c-default-$r; mv $L/peer.log $L/served-4c-default-$r/
  echo "== 4 cores, finished at once (pass $r)"; TANDEM_DISPATCH_FINISHED_AT_ONCE=1 taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"; mv $L/served $L/served-4c-atonce-$r; mv $L/peer.log $L/served-4c-atonce-$r/
done
finish
