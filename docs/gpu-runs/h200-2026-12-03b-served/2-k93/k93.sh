#!/usr/bin/env bash
# One H200: where a served round's time goes. `tandem up --device cuda` with its defaults against
# `bench engine` on the same 2,048 requests at 256 streams (SmolLM2 shape, random Q8_0; peer.sh
# LLAMA=0 TABLE=0 ROUNDS=2), servers' async runtimes at 2 and 8 threads
# (TANDEM_RUNTIME_THREADS): the decode worker's time between steps (idle, jobs, dispatch) and
# every server thread's CPU during each served run, and the device's own time per step (CUDA events).
source scripts/gpu/session.sh
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
for n in 2 8; do
  TANDEM_RUNTIME_THREADS=$n OUT=$L/served-t$n LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 150 bash scripts/gpu/peer.sh run > $L/peer-t$n.log 2>&1
  echo "$(el) served threads $n rc=$?"; grep -E "tandem up, client|^round|decode worker|TTFT mean|cores busy|device" $L/peer-t$n.log | cut -c1-400
done
rm -f $L/served-*/peer/*.gguf
for f in $L/served-*/peer/round*-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish
