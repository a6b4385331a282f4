#!/usr/bin/env bash
# One H100: where a served round's time goes, step by step (the worker's step log against bench
# engine's steps by kind on the same requests): two rounds of 2,048 requests, one of 4,096 (is the
# gap a fixed cost of the run's start and end?), one with the server and the client on separate
# halves of the cores (is it the host?); then prompts beside 256 decoding rows in one step.
source scripts/gpu/session.sh
echo "== 2,048 requests"; STEP_LOG=1 served 2; mv $L/served $L/served-2048
echo "== 4,096 requests"; STEP_LOG=1 ROUND_PROMPTS=4096 served 1; mv $L/served $L/served-4096
echo "== split cores"; STEP_LOG=1 PLACEMENTS=split served 1; mv $L/served $L/served-split
timeout 100 $g bench-mixed $S 256 100-300 1x108,2x108,4x108,7x108 f16 > $L/mixed.log 2>&1
echo "$(el) bench-mixed rc=$?"; grep "mixed step" $L/mixed.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
finish
