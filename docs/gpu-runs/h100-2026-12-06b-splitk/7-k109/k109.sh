#!/usr/bin/env bash
# One H100: the checks with cuBLASLt's first three candidates pinned for products of 96 and 130
# rows (each compared with the host's product), in bf16 and f16.
source scripts/gpu/session.sh
chk bf16
chk f16
grep -E "cuBLASLt" $L/check-bf16.log | cut -c1-160
finish
