#!/usr/bin/env bash
# The engine thread with a step's one token per sequence and one completion per request held
# inline (SmallVec), StepUpdate sized up front and schedule's buffers kept (0aaa103c) against the
# tree before it (aa7ed40f, whose code is 4eeb51bf's; tandem-base.xz). nano-vllm's workload on
# the new binary (its digest must stay 702eafd0a1152da3), then served rounds (tandem up --device
# cuda defaults against bench engine, 2,048 requests of 108 + 128 at 256 streams, every core),
# alternating base, new, new, base, with the decode worker's phases a step.
source scripts/gpu/session.sh
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
cp .gpu/tandem/tandem .gpu/tandem/tandem-new
eng nano-new $NANO; grep -E "^HBM|^per step" $L/engine-nano-new.log | cut -c1-250; kinds nano-new
for tag in base-1 new-1 new-2 base-2; do
  cp .gpu/tandem/tandem-${tag%-*} .gpu/tandem/tandem
  echo "== $tag"; served 1
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
finish
