#!/usr/bin/env bash
# One H200, the final kernel (the fused prologue's key and value stores fenced at GPU scope
# before the barrier: k76's check saw a copy right after it read a slot's old key): the kernel
# checks twice in bf16 and once in f16, random Llamas end to end, decode steps, and the engine's
# digests against the tree before on nano-vllm's workload and greedy small batches of long
# contexts.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem .gpu/pack
for f in tandem-gpu:bin tandem:tandem old-tandem-gpu:pack old-tandem:pack; do
  xz -dc $C/${f%%:*}.xz > .gpu/${f##*:}/${f%%:*}; chmod +x .gpu/${f##*:}/${f%%:*}; done
cp -r $C/configs .gpu/bin/
g=.gpu/bin/tandem-gpu; og=.gpu/pack/old-tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/pack/old-tandem
S=.gpu/bin/configs/smollm2-135m-shape.json; Q=.gpu/bin/configs/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 bf16-again f16; do
  timeout 200 $g check ${d%-again} > $L/check-$d.log 2>&1; echo "$(el) check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log) fused pass=$(grep -c 'PASS fused' $L/check-$d.log)"; grep -E "FAIL" $L/check-$d.log | cut -c1-300
done
for hd in 64 128; do
  python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd$hd $hd > /dev/null 2>&1
  timeout 150 $g e2e /tmp/llama-hd$hd f16 > $L/e2e-llama-hd$hd.log 2>&1; echo "$(el) e2e hd$hd rc=$? pass=$(grep -c PASS $L/e2e-llama-hd$hd.log) fail=$(grep -c FAIL $L/e2e-llama-hd$hd.log)"
done
dec() { # tag binary cfg batches contexts
  timeout 150 $2 bench-decode $3 $4 $5 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')| unfused: $(grep -oE 'own \(not fused into the decode kernel\): step [0-9.]+' $L/decode-$1.log | awk '{print $NF}' | tr '\n' ' ')"
}
dec Q-new $g $Q 1,16,64,256 100-2048; dec Q-old $og $Q 1,16,64,256 100-2048
dec S-new $g $S 1,64,256 100-300; dec S-old $og $S 1,64,256 100-300
eng() { # tag args...
  local tag=$1; shift
  for v in new old; do b=$t; [ $v = old ] && b=$ot
    timeout 100 $b bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag-$v.log 2>&1
    echo "$(el) $tag $v rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-$tag-$v.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
  done
}
for r in 1 2; do eng nano-r$r --model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384; done
for n in 4 16 32; do
  eng long-greedy-$n --model $Q --num-prompts $n --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs $n --temperature 0
done
eng served --model $S --dtype f16 --num-prompts 2048 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192
tar czf $OUT/logs.tgz -C $L .
