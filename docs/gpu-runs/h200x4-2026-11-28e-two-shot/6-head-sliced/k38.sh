#!/usr/bin/env bash
# The LM head sliced across a tensor-parallel group (each rank the logits of its vocabulary
# slice, gathered over peer memory), four NVIDIA H200: tp.sh check (TP=2 and TP=4) and
# tp.sh disagg, engine digests of the tiny Llama at TP=1/TP=2, the 70B shape's decode at TP=2
# and TP=4 with the head sliced and whole (TANDEM_TP_HEAD=whole).
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv > $L/smi.log
OUT=$L bash scripts/gpu/tp.sh check > $L/tp-sh-check.log 2>&1; echo "tp.sh check rc=$?"; grep -E "PASS|FAIL" $L/tp-sh-check.log | grep -v "sequence" | cut -c1-120
tiny="--model tests/data/tiny-llama --num-prompts 64 --input-len 100 --min-input-len 20 --output-len 64 --min-output-len 64 --max-num-seqs 32"
for tp in 1 2; do for temp in 0 0.8; do
  timeout 120 $t bench engine --device cuda $tiny --temperature $temp --tensor-parallel-size $tp > $L/tiny-tp$tp-t$temp.log 2>&1; echo "tiny TP=$tp t=$temp rc=$? $(grep digest $L/tiny-tp$tp-t$temp.log)"
done; done
dec() { timeout 400 env $2 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 $3 > $L/decode-70b-$1.log 2>&1; echo "== $1 rc=$?"; grep -E "decode llama" $L/decode-70b-$1.log | cut -c1-170; }
dec tp2-sliced X=1 2
dec tp2-whole TANDEM_TP_HEAD=whole 2
dec tp4-sliced X=1 4
dec tp4-whole TANDEM_TP_HEAD=whole 4
OUT=$L timeout 300 bash scripts/gpu/tp.sh disagg > $L/disagg.log 2>&1; echo "disagg rc=$?"; grep -E "greedy:|free when idle|passed|FAIL" $L/disagg.log | cut -c1-200
tar czf $OUT/logs.tgz -C $L .
