#!/usr/bin/env bash
# Binaries of 1dea27f4 (CUDA code as on main). Where the Llama-3-8B shape's decode step at 64
# sequences (context 1,024; 84.4 % of the HBM roofline on a fast H100, goal 85 %) and Qwen3's at
# 192 over 100-2,000 (the workload's largest class) spend their time, kernel by kernel under
# Nsight Compute (scripts/gpu/step_kernels.py: each kernel alone, its DRAM bytes and bandwidth).
source scripts/gpu/session.sh
K="python3 scripts/gpu/step_kernels.py --bin $g"
for s in "$E 64 1024" "$Q 192 100-2000" "$E 256 1024"; do
  set -- $s; n=$(basename $1 .json)-$2
  timeout 170 $K $1 $2 $3 > $L/kernels-$n.log 2>&1
  echo "$(el) kernels $n rc=$?"; head -24 $L/kernels-$n.log | cut -c1-110
done
finish
