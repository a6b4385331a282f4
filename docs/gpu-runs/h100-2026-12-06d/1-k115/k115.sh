#!/usr/bin/env bash
# One H100: served rounds with 95230f0's abort fix (an ended request's abort leaves the step in
# flight) against the same tree without it (tandem-base.xz), alternating, at the default step
# budget and at --max-num-batched-tokens 1024 (where k114 saw 527 us of jobs a step); then what
# prompts of 108 tokens cost beside 232 decoding rows in one mixed step (SmolLM2 shape, f16).
source scripts/gpu/session.sh
cp .gpu/tandem/tandem .gpu/tandem/tandem-fix
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
for r in 1 2; do
  for v in fix base; do
    cp .gpu/tandem/tandem-$v .gpu/tandem/tandem
    echo "== $v (pass $r)"; served 2
    mv $L/served $L/served-$v-$r
  done
done
for v in fix base; do
  cp .gpu/tandem/tandem-$v .gpu/tandem/tandem
  echo "== $v, tandem up --max-num-batched-tokens 1024"; UP_FLAGS="--max-num-batched-tokens 1024" served 2
  mv $L/served $L/served-$v-1024
done
timeout 150 $g bench-mixed $S 232 108-236 1x108,2x108,4x108,7x108,12x108,24x108 f16 > $L/mixed.log 2>&1
echo "$(el) bench-mixed rc=$?"; grep -vE '^\s*$' $L/mixed.log | tail -30 | cut -c1-220
finish
