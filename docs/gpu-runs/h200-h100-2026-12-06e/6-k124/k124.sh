#!/usr/bin/env bash
# Same machine as k121-k123, right after them, every core: outputs between steps with the
# 1,024-row mixed-step graphs (the tree before this stop) against outputs during the next step
# with mixed-step graphs to 8,192 rows, three rounds each, alternating.
source scripts/gpu/session.sh
one() { served 1; mv $L/served $L/served-$1; mv $L/peer.log $L/served-$1/; }
for r in 1 2 3; do
  echo "== between steps, graphs to 1,024 rows (pass $r)"; TANDEM_DISPATCH_IN_STEP=0 STEP_LOG=1 one before-$r
  echo "== during the next step, graphs to 8,192 rows (pass $r)"; TANDEM_MIXED_GRAPH_MAX_ROWS=8192 STEP_LOG=1 one after-$r
done
finish
