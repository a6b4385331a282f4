#!/usr/bin/env bash
# Steps overlapping the device (default) against steps that wait (--no-step-overlap), same
# binary: the kernel check, the nano-vllm workload, 256 x (1024 + 128) through bench engine,
# and the served path against the engine (peer.sh rounds, Q8_0 SmolLM2 shape).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
$g check bf16 > $L/check-bf16.log 2>&1; echo "check bf16 rc=$? $(grep -c PASS $L/check-bf16.log) pass $(grep -c FAIL $L/check-bf16.log) fail"
timeout 120 $g e2e tests/data/tiny-qwen3 f16 > $L/e2e-tiny-qwen3.log 2>&1; echo "e2e qwen3 rc=$? $(grep -c PASS $L/e2e-tiny-qwen3.log) pass $(grep -c FAIL $L/e2e-tiny-qwen3.log) fail"
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { grep -E 'throughput|decode phase|steps|per step|digest' "$1" | tr -s ' ' | cut -c1-150 | tr '\n' ';'; }
for i in 1 2 3; do for v in overlap wait; do f=(); [ $v = wait ] && f=(--no-step-overlap)
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 "${f[@]}" > $L/engine-$v-$i.log 2>&1
  echo "workload $v $i: $(eng $L/engine-$v-$i.log)"
done; done
for v in overlap wait; do f=(); [ $v = wait ] && f=(--no-step-overlap)
  for n in 256 64; do
    timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --num-prompts $n --input-len 1024 --min-input-len 1024 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 16384 --temperature 0.6 "${f[@]}" > $L/host-$v-$n.log 2>&1
    echo "1024+128 x $n $v: $(eng $L/host-$v-$n.log)"
  done
done
OUT=/tmp/peerout LLAMA=0 TABLE=0 ROUNDS=${ROUNDS:-2} VARIANTS="default no-overlap" PLACEMENTS=shared timeout 420 bash scripts/gpu/peer.sh run > $L/peer-summary.txt 2>&1
tail -20 $L/peer-summary.txt
cp -r /tmp/peerout/peer $L/peer 2>/dev/null
tar czf $OUT/logs.tgz -C $L .
