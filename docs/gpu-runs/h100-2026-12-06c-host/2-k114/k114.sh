#!/usr/bin/env bash
# One H100: served rounds of `tandem up` with smaller steps (--max-num-batched-tokens 1024 / 2048
# / 4096) against its default 8,192, two rounds each; `bench engine` keeps 8,192 throughout
# (the tree of 6f26d5d: mimalloc).
source scripts/gpu/session.sh
for tok in 8192 2048 1024 4096; do
  echo "== tandem up --max-num-batched-tokens $tok"
  UP_FLAGS="--max-num-batched-tokens $tok" served 2
  mv $L/served $L/served-$tok
done
finish
