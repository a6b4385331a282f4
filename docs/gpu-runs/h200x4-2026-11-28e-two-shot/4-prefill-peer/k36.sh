#!/usr/bin/env bash
# Prefill's all-reduces through peer memory with the RMSNorm (TANDEM_TP_PEER_ROWS=8192) against
# NCCL's (the default above 512 rows), four NVIDIA H200: 70B and 8B shapes, 4 x 2048 tokens, at
# TP=2 and TP=4 (two shots at TP=4); the 8B greedy check with prefill through peer memory.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv | tee $L/smi.log
pf() { timeout 300 env $2 $g bench-prefill .gpu/bin/configs/$3.json 4 2048 $4 > $L/prefill-$1.log 2>&1; echo "== $1 rc=$?"; grep -E "prefill|rror" $L/prefill-$1.log | cut -c1-220; }
for tp in 2 4; do
  pf l70b-tp$tp-nccl X=1 llama-3-70b $tp
  pf l70b-tp$tp-peer TANDEM_TP_PEER_ROWS=8192 llama-3-70b $tp
  pf l8b-tp$tp-nccl X=1 llama-3-8b $tp
  pf l8b-tp$tp-peer TANDEM_TP_PEER_ROWS=8192 llama-3-8b $tp
done
timeout 240 env TANDEM_TP_PEER_ROWS=8192 $g tp-check .gpu/bin/configs/llama-3-8b.json 2 64 16 > $L/tp2-check-8b-peer-rows.log 2>&1; echo "tp-check rc=$?"; tail -1 $L/tp2-check-8b-peer-rows.log
timeout 240 $g tp-check .gpu/bin/configs/llama-3-8b.json 2 64 16 > $L/tp2-check-8b-default.log 2>&1; echo "tp-check rc=$?"; tail -1 $L/tp2-check-8b-default.log
tar czf $OUT/logs.tgz -C $L .
