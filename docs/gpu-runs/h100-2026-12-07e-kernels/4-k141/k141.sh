#!/usr/bin/env bash
# The engine thread's host work a step with fewer allocations (the runner builds each step's
# batch in the last one's buffers, block tables included; a deferred token without a copy of the
# sequence's tokens; foldhash for the per-step maps; no scan of the running set per scheduled
# sequence; no grammar map when nothing is constrained) against 5af86e1c's `tandem`
# (tandem-base.xz). First the Must-show figures on the new binaries: the bf16 checks, nano-vllm's
# workload (its digest must stay 702eafd0a1152da3), the 8B decode steps at 64 / 256 against the
# HBM roofline, the 8B 4 x 2,048 prefill against the GEMM peak; then served rounds (tandem up
# --device cuda defaults against bench engine, 2,048 requests of 108 + 128 at 256 streams, every
# core), alternating base, new, new, base.
source scripts/gpu/session.sh
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
cp .gpu/tandem/tandem .gpu/tandem/tandem-new
chk bf16
eng nano-new $NANO; grep -E "^HBM|^per step" $L/engine-nano-new.log | cut -c1-250; kinds nano-new
if [ "${MUST:-1}" = 1 ]; then  # MUST=0 (not an H100): the A/B alone
  dec l8b $E 64,256 1024
  timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
  echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
fi
for tag in base-1 new-1 new-2 base-2; do
  cp .gpu/tandem/tandem-${tag%-*} .gpu/tandem/tandem
  echo "== $tag"; served 1
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
finish
