#!/usr/bin/env bash
# One H200: where the served path's TTFT goes (client, router, engine) and whether more HTTP/2
# connections from the router to its worker (TANDEM_WORKER_CONNECTIONS) change it: rounds of
# 2,048 requests of 108 + 128 tokens at 256 streams, client on every core.
set -u
L=/tmp/logs; mkdir -p $L
OUT=$L/n2048 LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 VARIANTS="default conns4 conns16" timeout 500 bash scripts/gpu/peer.sh run > $L/peer-n2048.log 2>&1
echo "rc=$?"; grep -A60 "^round1" $L/peer-n2048.log | grep -vE "^\s*$" | head -40
rm -f $L/n*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
