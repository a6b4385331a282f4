#!/usr/bin/env bash
# One H100: served rounds with `abort_request` of an ended request leaving the step in flight
# (the decode worker aborts every stream it drops; before, each such abort collected the step
# in flight and the next step could not be planned ahead) against the tree before (6f26d5d,
# carried as tandem-base.xz), alternating, two rounds each time. Then what prompt chunks cost
# beside decoding sequences on the served SmolLM2 shape (f16): `bench-mixed` with 232 and 128
# decode rows (contexts 108-236) and 1-24 prompts of 108 tokens, eager against the mixed-step
# graph, beside the decode rows alone.
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
for n in 232 128; do
  timeout 200 $g bench-mixed $S $n 108-236 1x108,2x108,4x108,7x108,12x108,24x108 f16 > $L/mixed-$n.log 2>&1
  echo "$(el) mixed $n rc=$?"; grep -E "mixed step" $L/mixed-$n.log | sed -E 's/.*: ([0-9]+ decode rows .*) ms; the decode rows alone \(decode graph\) ([0-9.]+) ms.*/\1 ms; alone \2 ms/'
done
finish
