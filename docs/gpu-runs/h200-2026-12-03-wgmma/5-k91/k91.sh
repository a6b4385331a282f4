#!/usr/bin/env bash
# One H200: served rounds (`tandem up --device cuda` with its defaults against `bench engine` on
# the same 2,048 requests at 256 streams, SmolLM2 shape from a random Q8_0 file; peer.sh with
# LLAMA=0 TABLE=0 ROUNDS=1) with the servers' async runtimes at 8 threads
# (TANDEM_RUNTIME_THREADS) and at 2 (the default), one round each (little device time was left).
source scripts/gpu/session.sh
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
for r in 1; do for n in 8 2; do
  TANDEM_RUNTIME_THREADS=$n OUT=$L/served-t$n-r$r LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 130 bash scripts/gpu/peer.sh run > $L/peer-t$n-r$r.log 2>&1
  echo "$(el) served threads $n r$r rc=$?"; grep -E "tandem up, client|^round1|decode worker|TTFT mean" $L/peer-t$n-r$r.log | cut -c1-260
done; done
rm -f $L/served-*/peer/*.gguf
for f in $L/served-*/peer/round1-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish
