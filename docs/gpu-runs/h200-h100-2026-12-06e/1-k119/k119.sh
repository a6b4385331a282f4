#!/usr/bin/env bash
# One GPU: (1) a pass's inputs as one copy from page-locked memory and one scatter kernel
# (backend/uploads.rs) against one pageable copy each (TANDEM_PACKED_UPLOADS=0, as before):
# bench engine's outputs digest and tok/s both ways; (2) mixed-step graphs up to 8,192 rows
# (k118's first half: graph against eager logits at shapes above 1,024 rows); (3) served rounds
# with the step log: pageable copies, packed, packed with mixed-step graphs to 8,192 rows, twice.
source scripts/gpu/session.sh
for v in 0 1; do TANDEM_PACKED_UPLOADS=$v eng g16-packed$v $G16; done
for v in 0 1 0 1; do TANDEM_PACKED_UPLOADS=$v eng nano-packed$v $NANO; kinds nano-packed$v; done
TANDEM_MIXED_GRAPH_MAX_ROWS=8192 timeout 100 $g bench-mixed $S 64,256 100-300 8x108,20x108,36x108,70x108 f16 > $L/mixed-8192.log 2>&1
echo "$(el) bench-mixed (limit 8,192) rc=$?"; grep "mixed step" $L/mixed-8192.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
for r in 1 2; do
  echo "== pageable copies (pass $r)"; TANDEM_PACKED_UPLOADS=0 STEP_LOG=1 served 1; mv $L/served $L/served-pageable-$r; mv $L/peer.log $L/served-pageable-$r/
  echo "== packed (pass $r)"; STEP_LOG=1 served 1; mv $L/served $L/served-packed-$r; mv $L/peer.log $L/served-packed-$r/
  echo "== packed, mixed graphs to 8,192 rows (pass $r)"; TANDEM_MIXED_GRAPH_MAX_ROWS=8192 STEP_LOG=1 served 1; mv $L/served $L/served-8192-$r; mv $L/peer.log $L/served-8192-$r/
done
finish
