#!/usr/bin/env bash
# Decode attention on the H200: the Qwen3-0.6B shape's step at batch 16-256 over contexts
# 100-2048 against the HBM roofline (measured in the same run), default and with the kernel's
# knobs (pipeline stages, warps per CTA, CTAs per SM the splits aim at); ncu per kernel at 64, 256.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
bd() { local n="$1"; shift; timeout 150 env "$@" $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 16,64,128,256 100-2048 > $L/decode-$n.log 2>&1; echo "== decode-$n rc=$?"; grep -E "limit:|decode qwen3" $L/decode-$n.log | cut -c24-190; }
bd default X=1
bd stages3 TANDEM_MMA_STAGES=3
bd stages4 TANDEM_MMA_STAGES=4
bd warps2 TANDEM_DEC_WARPS=2
bd ctas4 TANDEM_SPLIT_CTAS_PER_SM=4
bd stages3-ctas4 TANDEM_MMA_STAGES=3 TANDEM_SPLIT_CTAS_PER_SM=4
bd copy-only TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY
for b in 64 256; do
  timeout 200 python3 scripts/gpu/step_kernels.py --bin $g .gpu/bin/configs/qwen3-0.6b.json $b 100-2048 > $L/kernels-b$b.log 2>&1; head -14 $L/kernels-b$b.log | cut -c1-110
done
tar czf $OUT/logs.tgz -C $L .
