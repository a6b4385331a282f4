#!/usr/bin/env bash
# One H200: mixed-step graphs with grids fixed by the row bucket (few shapes). e2e checks,
# bench-mixed (eager vs graph, logits compared), then Poisson arrivals through `tandem up
# --device cuda` (the steps a server runs while requests arrive), new vs the tree before.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; o=.gpu/pack/old-tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in tiny-llama tiny-qwen3; do timeout 100 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e $m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail; $(grep -i 'mixed-step' $L/e2e-$m.log | cut -c1-220)"; done
timeout 150 $g bench-mixed $S 64,256 100-300 1x108,2x108,4x108,1x512,4x16 f16 > $L/mixed-S.log 2>&1; echo "mixed S rc=$?"; grep "mixed step" $L/mixed-S.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
timeout 150 $g bench-mixed $Q 16,64,256 100-2048 1x108,2x108,1x512,2x32 bf16 > $L/mixed-Q.log 2>&1; echo "mixed Q rc=$?"; grep "mixed step" $L/mixed-Q.log | sed -E 's/.*: ([0-9]+ decode rows.*)/\1/'
python3 scripts/gpu/random_gguf.py .gpu/peer/smollm2-meta.gguf /tmp/random-q8_0.gguf > /dev/null
M=/tmp/random-q8_0.gguf; port=18000
wait_http() { for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && return 0; kill -0 "$1" 2>/dev/null || return 1; sleep 0.2; done; return 1; }
cp $t /tmp/new-tandem
for r in 1 2; do for v in new old; do b=/tmp/new-tandem; [ $v = old ] && b=$o
  $b up --device cuda --model $M --served-model-name smollm2 --port $port > /dev/null 2> $L/up-$v-r$r.log &
  pid=$!
  if wait_http $pid; then
    $b bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2 --num-prompts 512 --concurrency 256 --input-len 108 --output-len 128 --ignore-eos --quiet > /dev/null 2>&1
    for rate in 400 800; do
      timeout 60 $b bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2 --seed 7 --num-prompts $((rate * 5)) --request-rate $rate --input-len 108 --output-len 128 --ignore-eos --quiet --json $L/poisson-$v-$rate-r$r.json > /dev/null 2>&1
      python3 -c "
import json,sys;d=json.load(open('$L/poisson-$v-$rate-r$r.json'));r=d['result']
print('poisson $v r$r rate $rate: out %.0f tok/s, TTFT p50 %.1f p99 %.1f ms, TPOT p50 %.3f p99 %.3f ms, e2e p50 %.0f ms, failed %d' % (r['output_throughput'], r['ttft']['median_ms'], r['ttft']['p99_ms'], r['tpot']['median_ms'], r['tpot']['p99_ms'], r['e2e']['median_ms'], r['failed']))"
    done
    echo "  $v r$r: mixed-step graphs captured: $(grep -c 'captured a mixed-step graph' $L/up-$v-r$r.log)"
  fi
  kill -INT $pid; wait $pid 2>/dev/null
done; done
tar czf $OUT/logs.tgz -C $L .
