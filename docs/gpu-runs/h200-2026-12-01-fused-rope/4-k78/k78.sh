#!/usr/bin/env bash
# One H200: the fused kernel's check with a block table of its own for every sequence (k75-k77's
# check let the long sequence's table share blocks with the others, so what it read depended on
# when their CTAs stored), both 16-bit types; then two alternating pairs of served rounds
# (`tandem up` against `bench engine`, 2,048 requests at 256 streams), new and the tree before.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem .gpu/pack .gpu/peer
for f in tandem-gpu:bin tandem:tandem old-tandem:pack; do
  xz -dc $C/${f%%:*}.xz > .gpu/${f##*:}/${f%%:*}; chmod +x .gpu/${f##*:}/${f%%:*}; done
cp $C/smollm2-meta.gguf .gpu/peer/
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; ot=.gpu/pack/old-tandem
L=/tmp/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 f16; do
  timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "$(el) check $d rc=$? pass=$(grep -c PASS $L/check-$d.log) fail=$(grep -c FAIL $L/check-$d.log) fused pass=$(grep -c 'PASS fused' $L/check-$d.log)"; grep -E "FAIL" $L/check-$d.log | cut -c1-300
done
cp $t /tmp/new-tandem
for r in 1 2; do for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$ot; cp $b $t
  OUT=$L/served-$v-r$r LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 110 bash scripts/gpu/peer.sh run > $L/peer-$v-r$r.log 2>&1
  echo "$(el) peer $v r$r rc=$?"; grep -E "tandem up, client|^round1" $L/peer-$v-r$r.log | cut -c1-200
done; done
cp /tmp/new-tandem $t
rm -f $L/served-*/peer/*.gguf
for f in $L/served-*/peer/round1-up-shared.log; do grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; done
tar czf $OUT/logs.tgz -C $L .
