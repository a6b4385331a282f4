#!/usr/bin/env bash
# Issue 30's table with this tree: llama.cpp CUDA built here, llama-server and tandem up on the
# same Q4_1 file and client (scripts/gpu/peer.sh run, TABLE=1), no rounds.
set -u
mkdir -p .gpu/peer && cp .gpu/pack/peer/* .gpu/peer/
OUT=/tmp/peerout LLAMA=1 TABLE=1 ROUNDS=0 timeout 570 bash scripts/gpu/peer.sh run > /tmp/peer-table-summary.txt 2>&1
echo "rc=$?" >> /tmp/peer-table-summary.txt
cat /tmp/peer-table-summary.txt
cp /tmp/peer-table-summary.txt /tmp/peerout/peer/summary.txt
for f in /tmp/peerout/peer/*-up-*.log /tmp/peerout/peer/up-*.log; do [ -f "$f" ] && { head -5 "$f" | sed 's/\x1b\[[0-9;]*m//g' > "$f.t"; mv "$f.t" "$f"; }; done
tar czf $OUT/table.tgz -C /tmp/peerout peer
