#!/usr/bin/env bash
# One H200: q/k norm + RoPE + KV store fused into the small-tile decode kernel
# (attention_dec_rope*), against the tree before (old-*) in the same run: the kernel checks
# (fused against the two kernels it replaces, bit for bit), random Llamas with 64- and 128-wide
# heads end to end, decode steps, nano-vllm's workload and the served workload in the engine
# (digests must match the tree before's).
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem .gpu/pack
for f in tandem-gpu:bin tandem:tandem old-tandem-gpu:pack old-tandem:pack; do
  xz -dc $C/${f%%:*}.xz > .gpu/${f##*:}/${f%%:*}; chmod +x .gpu/${f##*:}/${f%%:*}; done
cp -r $C/configs .gpu/bin/
g=.gpu/bin/tandem-gpu; og=.gpu/pack/old-tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/pack/old-tandem
S=.gpu/bin/configs/smollm2-135m-shape.json; Q=.gpu/bin/configs/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
$g info > $L/info.log 2>&1; grep -E "attention_dec" $L/info.log
timeout 240 $g check bf16 > $L/check-bf16.log 2>&1; echo "$(el) check bf16 rc=$? pass=$(grep -c PASS $L/check-bf16.log) fail=$(grep -c FAIL $L/check-bf16.log)"; grep -E "FAIL|fused" $L/check-bf16.log | cut -c1-230
for hd in 64 128; do
  python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd$hd $hd > /dev/null 2>&1
  timeout 150 $g e2e /tmp/llama-hd$hd f16 > $L/e2e-llama-hd$hd.log 2>&1; echo "$(el) e2e hd$hd rc=$? pass=$(grep -c PASS $L/e2e-llama-hd$hd.log) fail=$(grep -c FAIL $L/e2e-llama-hd$hd.log)"
done
dec() { # tag binary cfg batches contexts
  timeout 150 $2 bench-decode $3 $4 $5 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')| unfused: $(grep -oE 'own \(not fused into the decode kernel\): step [0-9.]+' $L/decode-$1.log | awk '{print $NF}' | tr '\n' ' ')| chain: $(grep -oE 'back to back: [0-9.]+' $L/decode-$1.log | awk '{print $4}' | tr '\n' ' ')"
}
for r in 1 2; do
  dec Q-new-r$r $g $Q 16,64,256 100-2048; dec Q-old-r$r $og $Q 16,64,256 100-2048
done
dec S-new $g $S 1,64,256 100-300; dec S-old $og $S 1,64,256 100-300
for r in 1 2; do for v in new old; do b=$t; [ $v = old ] && b=$ot
  timeout 100 $b bench engine --device cuda --load-format dummy --model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano-$v-r$r.log 2>&1
  echo "$(el) nano-vllm $v r$r rc=$?: $(grep -E '^throughput|digest' $L/engine-nano-$v-r$r.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done; done
for v in new old; do b=$t; [ $v = old ] && b=$ot
  timeout 100 $b bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 2048 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served-$v.log 2>&1
  echo "$(el) served workload $v rc=$?: $(grep -E '^throughput|digest' $L/engine-served-$v.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
done
tar czf $OUT/logs.tgz -C $L .
