#!/usr/bin/env bash
# k127 again on every core: four more pairs, finished outputs at once first this time.
source scripts/gpu/session.sh
for r in 4 5 6 7; do
  TANDEM_DISPATCH_FINISHED_AT_ONCE=1 served 1; mv $L/served $L/served-atonce-$r; mv $L/peer.log $L/served-atonce-$r/
  served 1; mv $L/served $L/served-default-$r; mv $L/peer.log $L/served-default-$r/
done
finish
