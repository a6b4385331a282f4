#!/usr/bin/env bash
# One H100: sample_rows reading a row once where it has no filter (the choice made beside the
# log-sum-exp) against the tree before (k103-k105's binary, carried as tandem-prev.xz: split-k
# as now, every row read twice). The checks (the sampling checks compare every token and
# log-probability with the engine's CPU sampler); nano-vllm's workload both ways, alternating,
# and greedy; bench-decode over contexts 100-2,000 (the workload's spread) against 100-1,500.
source scripts/gpu/session.sh
xz -dc $C/tandem-prev.xz > .gpu/tandem/tandem-prev && chmod +x .gpu/tandem/tandem-prev
chk bf16
chk f16
for r in 1 2; do
  eng nano-$r $NANO; kinds nano-$r
  t=.gpu/tandem/tandem-prev eng nano-prev-$r $NANO; kinds nano-prev-$r
done
eng nano-greedy ${NANO/--temperature 0.6/--temperature 0}; kinds nano-greedy
t=.gpu/tandem/tandem-prev eng nano-greedy-prev ${NANO/--temperature 0.6/--temperature 0}; kinds nano-greedy-prev
dec q3-1500 $Q 192,208 100-1500
dec q3-2000 $Q 192,208 100-2000
finish
