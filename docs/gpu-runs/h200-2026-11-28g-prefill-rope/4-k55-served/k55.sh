#!/usr/bin/env bash
# One H200: the served path against the engine on the current tree, rounds of 1,024 requests
# (about one second each) and of 4,096 (four), 256 streams of 108 + 128 tokens, client on every
# core; the decode worker's own TTFT and queue time beside the client's.
set -u
L=/tmp/logs; mkdir -p $L
for n in 1024 4096; do
  OUT=$L/n$n LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=$n timeout 280 bash scripts/gpu/peer.sh run > $L/peer-n$n.log 2>&1
  echo "== $n requests a round (rc=$?)"; grep -A40 "^round1" $L/peer-n$n.log | head -20
  for f in $L/n$n/peer/round*-served-shared.json; do python3 -c "
import json,sys; r=json.load(open('$f'))['result']; print('$f'.split('/')[-1], 'client TTFT mean %.1f p50 %.1f p99 %.1f ms, TPOT mean %.3f ms, e2e mean %.0f ms, %.3f s' % (r['ttft']['mean_ms'], r['ttft']['median_ms'], r['ttft']['p99_ms'], r['tpot']['mean_ms'], r['e2e']['mean_ms'], r['duration_s']))"; done
  grep -E "throughput|steps|per step" $L/n$n/peer/round*-engine.txt | cut -c1-140
done
rm -f $L/n*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
