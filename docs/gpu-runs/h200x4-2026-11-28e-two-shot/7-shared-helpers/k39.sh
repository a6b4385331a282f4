#!/usr/bin/env bash
# The peer all-reduce kernels rewritten over shared helpers (sum_pieces, add_pieces,
# store_normed), four NVIDIA H200: tp.sh check (TP=2 and TP=4; the counts must not move), the
# tiny Llama's engine digests at TP=2, the 70B shape's decode at TP=2 and TP=4.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm,memory.total --format=csv > $L/smi.log
OUT=$L bash scripts/gpu/tp.sh check > $L/tp-sh-check.log 2>&1; echo "tp.sh check rc=$?"; grep -E "PASS|FAIL" $L/tp-sh-check.log | grep -v "sequence" | cut -c1-60
tiny="--model tests/data/tiny-llama --num-prompts 64 --input-len 100 --min-input-len 20 --output-len 64 --min-output-len 64 --max-num-seqs 32"
for temp in 0 0.8; do
  timeout 120 $t bench engine --device cuda $tiny --temperature $temp --tensor-parallel-size 2 > $L/tiny-tp2-t$temp.log 2>&1; echo "tiny TP=2 t=$temp rc=$? $(grep digest $L/tiny-tp2-t$temp.log)"
done
timeout 400 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 > $L/decode-70b-tp2.log 2>&1; echo "rc=$?"; grep -E "decode llama|all-reduce" $L/decode-70b-tp2.log | cut -c1-170
timeout 400 $g bench-decode .gpu/bin/configs/llama-3-70b.json 16,64,256 1024 4 > $L/decode-70b-tp4.log 2>&1; echo "rc=$?"; grep -E "decode llama|all-reduce" $L/decode-70b-tp4.log | cut -c1-170
tar czf $OUT/logs.tgz -C $L .
