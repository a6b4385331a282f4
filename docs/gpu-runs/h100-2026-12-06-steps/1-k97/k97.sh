#!/usr/bin/env bash
# One H100: where nano-vllm's workload's time goes, by kind of step (`bench engine`'s new steps
# by kind and --steps-out records), twice; the decode step against the HBM roofline (Qwen3-0.6B
# and Llama-3-8B shapes) and the 4 x 2048 prefill against the GEMM peak; served rounds against
# bench engine (SmolLM2 shape, random Q8_0 in f16); the checks.
source scripts/gpu/session.sh
for r in 1 2; do
  eng nano-$r $NANO --steps-out $L/steps-nano-$r.jsonl
  grep -E "^HBM|^per step|^device|^launch|^prefill phase" $L/engine-nano-$r.log | cut -c1-250
  grep -A7 "^steps by kind" $L/engine-nano-$r.log | tail -n +2 | cut -c1-250
done
cp $L/steps-nano-1.jsonl $OUT/
dec q3-1024 $Q 16,64,256 1024
dec q3-var $Q 16,64,256 100-2048
dec l8b $E 64,256 1024
timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
chk bf16
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
OUT=$L/served LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 170 bash scripts/gpu/peer.sh run > $L/peer.log 2>&1
echo "$(el) served rc=$?"; grep -E "tandem up, client|^round|decode worker|TTFT mean|client ceiling" $L/peer.log | cut -c1-400
rm -f $L/served/peer/*.gguf
for f in $L/served/peer/round*-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish
