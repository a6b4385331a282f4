#!/usr/bin/env bash
# One H200: mixed-step graphs, final shape keys. e2e (f16, bf16), the served rounds of peer.sh
# (2,048 requests at 256 streams) and Poisson arrivals, new vs the tree before; nano-vllm's
# workload once each.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; o=.gpu/pack/old-tandem; C=.gpu/bin/configs
Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in f16 bf16; do for m in tiny-llama tiny-qwen3; do timeout 100 $g e2e tests/data/$m $d > $L/e2e-$m-$d.log 2>&1; echo "e2e $m $d rc=$? $(grep -c PASS $L/e2e-$m-$d.log) pass $(grep -c FAIL $L/e2e-$m-$d.log) fail; $(grep -i 'mixed-step' $L/e2e-$m-$d.log | cut -c1-220)"; done; done
cp $t /tmp/new-tandem
for r in 1 2; do for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$o; cp $b $t
  OUT=$L/served-$v-r$r LLAMA=0 TABLE=0 ROUNDS=1 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 100 bash scripts/gpu/peer.sh run > $L/peer-$v-r$r.log 2>&1
  echo "peer $v r$r rc=$?: $(grep -E 'tandem up, client' $L/peer-$v-r$r.log | tr -s ' ' | cut -c1-120) | engine: $(grep -E '^round1: bench engine' $L/peer-$v-r$r.log | cut -c1-60)"
done; done
cp /tmp/new-tandem $t
M=/tmp/random-q8_0.gguf; port=18000
wait_http() { for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && return 0; kill -0 "$1" 2>/dev/null || return 1; sleep 0.2; done; return 1; }
for r in 1 2; do for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$o
  $b up --device cuda --model $M --served-model-name smollm2 --port $port > /dev/null 2> $L/up-$v-r$r.log &
  pid=$!
  if wait_http $pid; then
    $b bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2 --num-prompts 512 --concurrency 256 --input-len 108 --output-len 128 --ignore-eos --quiet > /dev/null 2>&1
    for rate in 800 1000; do
      timeout 60 $b bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2 --seed 7 --num-prompts $((rate * 5)) --request-rate $rate --input-len 108 --output-len 128 --ignore-eos --quiet --json $L/poisson-$v-$rate-r$r.json > /dev/null 2>&1
      python3 -c "
import json,sys;d=json.load(open('$L/poisson-$v-$rate-r$r.json'));r=d['result']
print('poisson $v r$r rate $rate: out %.0f tok/s, TTFT p50 %.1f p99 %.1f ms, TPOT p50 %.3f p99 %.3f ms, e2e p50 %.0f ms, failed %d' % (r['output_throughput'], r['ttft']['median_ms'], r['ttft']['p99_ms'], r['tpot']['median_ms'], r['tpot']['p99_ms'], r['e2e']['median_ms'], r['failed']))"
    done
    echo "  $v r$r: mixed-step graphs captured: $(grep -c 'captured a mixed-step graph' $L/up-$v-r$r.log)"
  fi
  kill -INT $pid; wait $pid 2>/dev/null
done; done
for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$o
  timeout 200 $b bench engine --device cuda --load-format dummy --model $Q --workload-file .gpu/pack/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $L/engine-nano-$v.log 2>&1
  echo "nano $v rc=$?: $(grep -E 'throughput|digest|^steps' $L/engine-nano-$v.log | tr -s ' ' | cut -c1-80 | tr '\n' ';')"
done
rm -f $L/served-*/peer/*.gguf
tar czf $OUT/logs.tgz -C $L .
