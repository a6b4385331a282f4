#!/usr/bin/env bash
# One H200: steps with prompt chunks through mixed-step graphs. e2e checks (new graph-vs-eager
# check), bench-mixed (eager vs graph per step), then the served workload in `bench engine`,
# nano-vllm's workload and peer.sh's served rounds against the binary of the tree before.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; o=.gpu/pack/old-tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in tiny-llama tiny-qwen3; do timeout 100 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail; $(grep -i 'mixed-step' $L/e2e-$m.log | cut -c1-200)"; done
timeout 120 $g bench-mixed $S 64,256 100-300 1x108,2x108,4x108,8x108,1x512 f16 > $L/mixed-S.log 2>&1; echo "mixed S rc=$?"; grep "mixed step" $L/mixed-S.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
timeout 120 $g bench-mixed $Q 16,64,256 100-2048 1x108,2x108,1x512 bf16 > $L/mixed-Q.log 2>&1; echo "mixed Q rc=$?"; grep "mixed step" $L/mixed-Q.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
for r in 1 2; do for v in new old; do b=$t; [ $v = old ] && b=$o
  timeout 120 $b bench engine --device cuda --load-format dummy --model $S --dtype f16 --num-prompts 4096 --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-served-$v-r$r.log 2>&1
  echo "served workload $v r$r rc=$?: $(grep -E 'throughput|digest|^steps|per step' $L/engine-served-$v-r$r.log | tr -s ' ' | cut -c1-90 | tr '\n' ';')"
done; done
for v in new old; do b=$t; [ $v = old ] && b=$o
  timeout 200 $b bench engine --device cuda --load-format dummy --model $Q --workload-file .gpu/pack/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano-$v.log 2>&1
  echo "nano $v rc=$?: $(grep -E 'throughput|digest|^steps' $L/engine-nano-$v.log | tr -s ' ' | cut -c1-80 | tr '\n' ';')"
done
cp $t /tmp/new-tandem
for v in new old; do [ $v = old ] && cp $o $t; [ $v = new ] && cp /tmp/new-tandem $t
  OUT=$L/served-$v LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 150 bash scripts/gpu/peer.sh run > $L/peer-$v.log 2>&1
  echo "peer $v rc=$?"; grep -E "^round|share|tok/s" $L/peer-$v.log | head -12
done
cp /tmp/new-tandem $t
rm -f $L/served-*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
