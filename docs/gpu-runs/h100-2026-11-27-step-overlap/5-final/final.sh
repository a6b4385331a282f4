#!/usr/bin/env bash
# The session's final tree: checks, the nano-vllm workload, then peer.sh without llama.cpp:
# Tandem's part of the table (colocated and disaggregated, 1 / 32 / 256 streams, the long
# prompt, then 1,024 requests on the same server) and three rounds of bench engine against a
# fresh tandem up (client sharing the cores, and on its own half).
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
for dt in bf16 f16; do $g check $dt > $L/check-$dt.log 2>&1; echo "check $dt rc=$? $(grep -c PASS $L/check-$dt.log) pass $(grep -c FAIL $L/check-$dt.log) fail"; done
for arch in llama qwen3; do timeout 120 $g e2e tests/data/tiny-$arch f16 > $L/e2e-tiny-$arch.log 2>&1; echo "e2e $arch rc=$? $(grep -c PASS $L/e2e-tiny-$arch.log) pass $(grep -c FAIL $L/e2e-tiny-$arch.log) fail"; done
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
for i in 1 2; do f=$L/engine-$i.log
  timeout 200 $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1
  echo "workload $i: $(grep -E 'throughput|per step|digest' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"
done
mkdir -p .gpu/peer && cp .gpu/pack/peer/smollm2-meta.gguf .gpu/peer/
OUT=/tmp/peerout LLAMA=0 TABLE=1 ROUNDS=3 timeout 480 bash scripts/gpu/peer.sh run > $L/peer-summary.txt 2>&1
echo "peer rc=$?" >> $L/peer-summary.txt; tail -32 $L/peer-summary.txt
for f in /tmp/peerout/peer/*up*.log; do [ -f "$f" ] && { head -5 "$f" | sed 's/\x1b\[[0-9;]*m//g' > "$f.t"; mv "$f.t" "$f"; }; done
cp -r /tmp/peerout/peer $L/peer
tar czf $OUT/logs.tgz -C $L .
