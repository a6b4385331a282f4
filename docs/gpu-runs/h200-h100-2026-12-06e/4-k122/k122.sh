#!/usr/bin/env bash
# Same machine as k121, right after it: the same comparison on a host made short of cores —
# the engine, the server and the client all on cores 0-3 (taskset), three rounds each way.
source scripts/gpu/session.sh
for r in 1 2 3; do
  echo "== 4 cores, outputs between steps (pass $r)"; TANDEM_DISPATCH_IN_STEP=0 STEP_LOG=1 taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"; mv $L/served $L/served-between-$r; mv $L/peer.log $L/served-between-$r/
  echo "== 4 cores, outputs during the next step (pass $r)"; STEP_LOG=1 taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"; mv $L/served $L/served-instep-$r; mv $L/peer.log $L/served-instep-$r/
done
finish
