#!/usr/bin/env bash
# Two NVIDIA H200: each rank keeps only its slice of an untied LM head's rows (decided before
# loading, so the KV pool gets the memory): tp-check at TP=2 on the tiny models (their files,
# the sharded loader) and the 8B shape; the 70B shape's decode; the KV blocks a TP=2 engine
# sizes with the head sliced and whole (TANDEM_TP_HEAD=whole).
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in tests/data/tiny-llama tests/data/tiny-qwen3 tests/data/tiny-phi3 .gpu/bin/configs/llama-3-8b.json; do n=$(basename $m .json); timeout 300 $g tp-check $m 2 8 64 > $L/tp-$n.log 2>&1; echo "tp-check $n rc=$? $(tail -1 $L/tp-$n.log | cut -c1-100)"; done
TANDEM_TP_HEAD=whole timeout 300 $g tp-check .gpu/bin/configs/llama-3-8b.json 2 8 64 > $L/tp-8b-whole.log 2>&1; echo "tp-check 8b head whole rc=$? $(tail -1 $L/tp-8b-whole.log | cut -c1-100)"
for v in sliced whole; do e=X=1; [ $v = whole ] && e=TANDEM_TP_HEAD=whole; timeout 200 env $e RUST_LOG=info $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/llama-3-8b.json --tensor-parallel-size 2 --num-prompts 64 --input-len 256 --output-len 64 > $L/engine-8b-tp2-$v.log 2>&1; echo "engine 8b tp2 head $v rc=$?: $(grep -oE 'kv_blocks=[0-9]+' $L/engine-8b-tp2-$v.log | head -1) $(grep -E 'throughput|digest' $L/engine-8b-tp2-$v.log | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; done
timeout 200 $g bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 > $L/decode-70b-tp2.log 2>&1; echo "70b: $(grep -E 'decode .* step' $L/decode-70b-tp2.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2 \3/' | tr '\n' ' ')"
tar czf $OUT/logs.tgz -C $L .
