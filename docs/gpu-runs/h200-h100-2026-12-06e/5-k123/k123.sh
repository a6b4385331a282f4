#!/usr/bin/env bash
# Same machine as k121-k122, right after them, everything on cores 0-3 again: outputs between
# steps, during the next step, and during the next step with mixed-step graphs to 8,192 rows,
# three rounds each, alternating.
source scripts/gpu/session.sh
one() { taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"; mv $L/served $L/served-$1; mv $L/peer.log $L/served-$1/; }
for r in 1 2 3; do
  echo "== 4 cores, outputs between steps (pass $r)"; TANDEM_DISPATCH_IN_STEP=0 STEP_LOG=1 one between-$r
  echo "== 4 cores, outputs during the next step (pass $r)"; STEP_LOG=1 one instep-$r
  echo "== 4 cores, during the next step, mixed graphs to 8,192 rows (pass $r)"; TANDEM_MIXED_GRAPH_MAX_ROWS=8192 STEP_LOG=1 one instep-8192-$r
done
finish
