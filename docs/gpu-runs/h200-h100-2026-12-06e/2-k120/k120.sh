#!/usr/bin/env bash
# Same machine as k119, right after it: more served rounds, pageable copies and packed uploads
# alternating (three each), with the step log; nano-vllm's workload both ways again.
source scripts/gpu/session.sh
for v in 0 1 0 1; do TANDEM_PACKED_UPLOADS=$v eng nano-packed$v $NANO; done
for r in 1 2 3; do
  echo "== pageable copies (pass $r)"; TANDEM_PACKED_UPLOADS=0 STEP_LOG=1 served 1; mv $L/served $L/served-pageable-$r; mv $L/peer.log $L/served-pageable-$r/
  echo "== packed (pass $r)"; STEP_LOG=1 served 1; mv $L/served $L/served-packed-$r; mv $L/peer.log $L/served-packed-$r/
done
finish
