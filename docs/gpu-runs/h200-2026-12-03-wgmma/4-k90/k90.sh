#!/usr/bin/env bash
# One H200, the tree of this stop (stream GEMMs on wgmma): nano-vllm's workload twice with the
# HBM bound `bench engine` now prints (weights once a step + each decode token's KV at the
# copy bandwidth measured in the same run), then two served rounds (`tandem up --device cuda`
# with its defaults against `bench engine` on the same 2,048 requests at 256 streams, SmolLM2
# shape from a random Q8_0 file; scripts/gpu/peer.sh with LLAMA=0 TABLE=0 ROUNDS=1).
source scripts/gpu/session.sh
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
for r in 1 2; do eng nano-r$r $NANO; grep -E "HBM bound" $L/engine-nano-r$r.log | cut -c1-250; done
for r in 1 2; do
  OUT=$L/served-r$r LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 130 bash scripts/gpu/peer.sh run > $L/peer-r$r.log 2>&1
  echo "$(el) served r$r rc=$?"; grep -E "tandem up, client|^round1" $L/peer-r$r.log | cut -c1-220
done
rm -f $L/served-*/peer/*.gguf
for f in $L/served-*/peer/round1-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish
