#!/usr/bin/env bash
# One H200, after the fix of k75's split case (a split ending before the tile's first token
# stores nothing, and still rotates its queries): the kernel checks in both 16-bit types, random
# Llamas end to end, decode steps, the engine on nano-vllm's workload, on the served workload and
# on greedy small batches of long contexts (split contexts), each against the tree before
# (digests must match); then the served rounds (`tandem up` against `bench engine`) new and old.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem .gpu/pack .gpu/peer
for f in tandem-gpu:bin tandem:tandem old-tandem-gpu:pack old-tandem:pack; do
  xz -dc $C/${f%%:*}.xz > .gpu/${f##*:}/${f%%:*}; chmod +x .gpu/${f##*:}/${f%%:*}; done
cp -r $C/configs .gpu/bin/; cp $C/smollm2-meta.gguf .gpu/peer/
g=.gpu/bin/tandem-gpu; og=.gpu/pack/old-tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/pack/old-tandem
S=.gpu/bin/configs/smollm2-135m-shape.json; Q=.gpu/bin/configs/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 f16; do
  timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "$(el) check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log)"; grep -E "FAIL" $L/check-$d.log | cut -c1-300
done
grep -c "PASS fused" $L/check-bf16.log
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
eng served --model $S --dtype f16 --num-prompts 2048 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192
for n in 4 16 32; do
  eng long-greedy-$n --model $Q --num-prompts $n --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs $n --temperature 0
done
cp $t /tmp/new-tandem
for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$ot; cp $b $t
  OUT=$L/served-$v LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 110 bash scripts/gpu/peer.sh run > $L/peer-$v.log 2>&1
  echo "$(el) peer $v rc=$?"; grep -E "tandem up, client|^round1" $L/peer-$v.log | cut -c1-200
done
cp /tmp/new-tandem $t
rm -f $L/served-*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
