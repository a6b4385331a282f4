#!/usr/bin/env bash
# One H100: the tree of this stop (fused decode kernels copying pages before they wait, the
# default now; prompt steps queued). The checks; the SmolLM2-135M shape's step (64-wide heads,
# `attention_dec_rope64`) with and without early copies (TANDEM_DEC_EARLY_COPIES=off), alternating;
# Qwen3-0.6B and Llama-3-8B steps; nano-vllm's workload twice; served rounds against bench engine.
source scripts/gpu/session.sh
chk bf16
chk f16
for r in 1 2; do
  dec smol-$r $S 1,16,64,256 100-300
  TANDEM_DEC_EARLY_COPIES=off dec smol-off-$r $S 1,16,64,256 100-300
done
dec q3 $Q 1,16,64,256 1024
TANDEM_DEC_EARLY_COPIES=off dec q3-off $Q 1,16,64,256 1024
dec l8b $E 1,16,64,256 1024
for r in 1 2; do
  eng nano-$r $NANO
  grep -E "^HBM|^device" $L/engine-nano-$r.log | cut -c1-250
  grep -A7 "^steps by kind" $L/engine-nano-$r.log | tail -n +2 | cut -c1-250
done
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
OUT=$L/served LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 170 bash scripts/gpu/peer.sh run > $L/peer.log 2>&1
echo "$(el) served rc=$?"; grep -E "tandem up, client|^round|decode worker|TTFT mean|client ceiling" $L/peer.log | cut -c1-400
rm -f $L/served/peer/*.gguf
for f in $L/served/peer/round*-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish
