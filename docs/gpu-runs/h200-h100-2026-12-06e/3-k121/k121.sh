#!/usr/bin/env bash
# One GPU: served rounds with the step log, the decode worker handing a step's outputs to their
# streams during the next step (default) against between steps (TANDEM_DISPATCH_IN_STEP=0, as
# before), alternating, four each; packed uploads on in both.
source scripts/gpu/session.sh
for r in 1 2 3 4; do
  echo "== outputs between steps (pass $r)"; TANDEM_DISPATCH_IN_STEP=0 STEP_LOG=1 served 1; mv $L/served $L/served-between-$r; mv $L/peer.log $L/served-between-$r/
  echo "== outputs during the next step (pass $r)"; STEP_LOG=1 served 1; mv $L/served $L/served-instep-$r; mv $L/peer.log $L/served-instep-$r/
done
finish
