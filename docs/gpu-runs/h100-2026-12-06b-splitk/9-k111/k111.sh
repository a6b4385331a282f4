#!/usr/bin/env bash
# One H100: after the algorithm timing moved beside the plans (bench-gemm's and the tuning's
# candidate timing one function): the checks, bench-gemm and the 8B step at 64 sequences.
source scripts/gpu/session.sh
chk bf16
gem l8b $E 64
dec l8b $E 64 1024
grep -E "on the model's matrices" $L/decode-l8b.log | cut -c1-200
grep -E "\] gemm .* m=" $L/gemm-l8b.log | cut -c1-200
finish
