#!/usr/bin/env bash
# Planned on 2026-12-08 and not run yet (no device started for it that stop). Needs .gpu/c/ as
# served-steps did (tandem.xz from 4cfd381c or later, smollm2-meta.gguf, configs/). Once run,
# move it to docs/gpu-runs/<device>-<date>-served-placement/ with its logs.
# Why a served decode step of 129-256 rows takes ~7 % more device time than bench engine's at
# the same rows and mean context (1.34 against 1.25 ms at contexts 96-127 on an NVIDIA H100
# 80GB HBM3, served-steps run of 2026-12-08): the client and router sharing the host's cores
# with the engine thread (a step's start event recorded, its graph launched late), or not.
# Served rounds with the client on every core (shared) against the client and the server on
# separate halves of the cores (split), alternating, with the step log.
source scripts/gpu/session.sh
for tag in ${TAGS:-shared-1 split-1 shared-2 split-2}; do
  echo "== $tag"
  PLACEMENTS=${tag%-*} STEP_LOG=1 served 1
  grep -h "slowest" $L/served/peer/*-steps-*.txt | cut -c1-300
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
finish
