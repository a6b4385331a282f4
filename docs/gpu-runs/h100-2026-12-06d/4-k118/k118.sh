#!/usr/bin/env bash
# Not yet run (written at the end of the 2026-12-06 fourth stop, no device time left). One GPU:
# (1) mixed-step graphs up to 8,192 rows against the default 1,024, graph vs eager logits at
# large shapes first; (2) served rounds with the step log, alternating the two settings for both
# bench engine and tandem up — also the first served rounds with bench serve's connection
# warm-up (the 53 start steps of k117 should be gone).
source scripts/gpu/session.sh
TANDEM_MIXED_GRAPH_MAX_ROWS=8192 timeout 150 $g bench-mixed $S 64,256 100-300 8x108,20x108,36x108,70x108 f16 > $L/mixed-8192.log 2>&1
echo "$(el) bench-mixed (limit 8,192) rc=$?"; grep "mixed step" $L/mixed-8192.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
for r in 1 2; do
  echo "== default (pass $r)"; STEP_LOG=1 served 1; mv $L/served $L/served-default-$r
  echo "== mixed graphs to 8,192 rows (pass $r)"; TANDEM_MIXED_GRAPH_MAX_ROWS=8192 STEP_LOG=1 served 1; mv $L/served $L/served-8192-$r
done
finish
