#!/usr/bin/env bash
# Two H200: the KV blocks a TP=2 engine sizes with each rank keeping only its rows of the LM
# head (default) against the whole head on every rank (TANDEM_TP_HEAD=whole): Llama-3-8B and
# Llama-3-70B shapes, bf16 random weights, --gpu-memory-utilization default (0.9).
set -u
export NCCL_NVLS_ENABLE=0
t=.gpu/tandem/tandem; C=.gpu/bin/configs
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in llama-3-8b llama-3-70b; do for v in sliced whole; do e=X=1; [ $v = whole ] && e=TANDEM_TP_HEAD=whole
  timeout 170 env $e RUST_LOG=info $t bench engine --device cuda --load-format dummy --model $C/$m.json --tensor-parallel-size 2 --num-prompts 32 --input-len 128 --output-len 16 --min-output-len 16 > $L/engine-$m-$v.log 2>&1
  echo "$m head $v rc=$?: $(grep -oE 'of a [0-9]+ MiB pool' $L/engine-$m-$v.log | head -1) $(grep -E 'throughput|digest' $L/engine-$m-$v.log | tr -s ' ' | cut -c1-80 | tr '\n' ';')"
done; done
tar czf $OUT/logs.tgz -C $L .
