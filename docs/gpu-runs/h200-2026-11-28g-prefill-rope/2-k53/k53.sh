#!/usr/bin/env bash
# One H200: Nsight Compute's sections for the kernels of a prefill of 76 short prompts (108
# tokens) that take more than their bytes or FLOPs say: the prefill attention kernel, the
# q/k norm + RoPE + KV store, the RMSNorm — SmolLM2-135M shape (heads 64 wide) and Qwen3-0.6B (128).
set -u
g=.gpu/bin/tandem-gpu; S=.gpu/bin/configs/smollm2-135m-shape.json; Q=.gpu/bin/configs/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for m in "smollm2 $S 64" "qwen3 $Q 128"; do set -- $m
  for k in attention_prefill$3 qkv_rope_store rmsnorm_v1 silu_mul; do
    timeout 150 $NCU --clock-control none $SEC -k regex:$k --launch-skip 40 --launch-count 1 $g bench-prefill $2 76 108 > $L/ncu-$1-$k.txt 2>&1; echo "$1 $k rc=$?"
    grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Block Limit Shared Mem|Waves Per SM|Grid Size|Block Size|Warp Cycles Per Issued Instruction|Dynamic Shared|Static Shared)" $L/ncu-$1-$k.txt | tr -s ' ' | head -20
    grep -iE "stall|est\. speedup" $L/ncu-$1-$k.txt | head -6 | cut -c1-250
  done
done
tar czf $OUT/logs.tgz -C $L .
