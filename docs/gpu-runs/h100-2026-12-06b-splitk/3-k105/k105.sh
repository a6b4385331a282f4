#!/usr/bin/env bash
# One H100: what the workload's decode steps spend beyond bench-decode's graph replays of the
# same size. The workload greedy (temperature 0: no Gumbel draws in the sampling kernel) against
# 0.6, alternating; bench-decode at 200 sequences over contexts 100-1,500 and 100-2,000 (the
# workload's spread), and at 192 as in k104.
source scripts/gpu/session.sh
for r in 1 2; do
  eng nano-$r $NANO; kinds nano-$r
  eng nano-greedy-$r ${NANO/--temperature 0.6/--temperature 0}; kinds nano-greedy-$r
done
dec q3-1500 $Q 192,200 100-1500
dec q3-2000 $Q 192,200 100-2000
grep -E "eager stages|graph:" $L/decode-q3-2000.log | cut -c1-600
finish
