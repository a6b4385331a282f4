#!/usr/bin/env bash
# One H200: the served path's time to first token taken apart on the router's clock (prepare,
# worker_accept, first_token_wait; tandem_router_first_token_phase_seconds) beside the engine's
# own, in rounds of 2,048 requests of 108 + 128 tokens at 256 streams, client on every core.
set -u
L=/tmp/logs; mkdir -p $L
OUT=$L/n2048 LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 420 bash scripts/gpu/peer.sh run > $L/peer-n2048.log 2>&1
echo "rc=$?"; grep -A60 "^round1" $L/peer-n2048.log | grep -vE "^\s*$" | head -40
rm -f $L/n*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
