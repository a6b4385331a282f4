#!/usr/bin/env bash
# One H200: peer.sh's served round (2,048 requests at 256 streams) and Poisson arrivals at
# 1,000 requests/s through the same server, new (mixed-step graphs) vs the tree before,
# three alternating rounds each.
set -u
t=.gpu/tandem/tandem; o=.gpu/pack/old-tandem
L=/tmp/logs; mkdir -p $L
cp $t /tmp/new-tandem
for r in 1 2 3; do for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$o; cp $b $t
  OUT=$L/served-$v-r$r POISSON=1000 LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 100 bash scripts/gpu/peer.sh run > $L/peer-$v-r$r.log 2>&1
  echo "peer $v r$r rc=$?"; grep -E "tandem up, client|Poisson|^round1" $L/peer-$v-r$r.log | cut -c1-170
done; done
cp /tmp/new-tandem $t
rm -f $L/served-*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
