#!/usr/bin/env bash
# After table.sh on the same machine (llama-quantize built): the served/engine rounds with and
# without step overlap on the Q4_1 file, then scripts/gpu/up.sh (colocated against
# disaggregated answers) on that file.
set -u
mkdir -p .gpu/peer && cp .gpu/pack/peer/smollm2-meta.gguf .gpu/peer/
OUT=/tmp/roundsout LLAMA=0 TABLE=0 ROUNDS=${ROUNDS:-3} VARIANTS="default no-overlap" PLACEMENTS=shared timeout 420 bash scripts/gpu/peer.sh run > /tmp/rounds-summary.txt 2>&1
echo "rc=$?" >> /tmp/rounds-summary.txt; tail -30 /tmp/rounds-summary.txt
cp /tmp/rounds-summary.txt /tmp/roundsout/peer/summary.txt
for f in /tmp/roundsout/peer/*-up-*.log; do [ -f "$f" ] && { head -5 "$f" | sed 's/\x1b\[[0-9;]*m//g' > "$f.t"; mv "$f.t" "$f"; }; done
OUT=/tmp/roundsout/up timeout 150 bash scripts/gpu/up.sh /tmp/random-q4_1.gguf > /tmp/roundsout/up-summary.txt 2>&1; echo "up.sh rc=$?" >> /tmp/roundsout/up-summary.txt
tail -12 /tmp/roundsout/up-summary.txt
for f in /tmp/roundsout/up/up-*.log; do [ -f "$f" ] && { grep -v "tandem_router::" "$f" | sed 's/\x1b\[[0-9;]*m//g' | head -40 > "$f.t"; mv "$f.t" "$f"; }; done
tar czf $OUT/rounds.tgz -C /tmp/roundsout .
