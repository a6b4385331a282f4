#!/usr/bin/env bash
# The serving benchmark's own ceiling beside what it measures, on one GPU host: `tandem bench serve
# --stub` (the client against a built-in server that answers at once, every CPU of the host),
# `tandem bench engine` on the same requests (SmolLM2-135M shape, random weights, real tokenizer:
# the metadata-only GGUF of scripts/gpu/gguf_metadata_only.py at .gpu/bin/smollm2-meta.gguf), and
# `tandem up --device cuda` with its defaults driven by `tandem bench serve`; 256 and 1024
# requests of 108 + 128 tokens, 256 in flight, each run with its own seed (no prefix-cache hits
# between runs). Logs and JSON in $OUT/serve.
set -u
OUT="${OUT:-.gpu/out}"
B=.gpu/tandem/tandem; M=.gpu/bin/smollm2-meta.gguf; o=$OUT/serve; mkdir -p $o; port=18000
nvidia-smi --query-gpu=name --format=csv,noheader; echo "cores: $(nproc)"
py() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['result']; print(sys.argv[2], 'out %.0f tok/s, TTFT p50 %.1f p99 %.1f ms, completed %d failed %d' % (r['output_throughput'], r['ttft']['median_ms'], r['ttft']['p99_ms'], r['completed'], r['failed']))" "$@"; }
for n in 256 1024; do
  $B bench serve --stub --num-prompts $n --concurrency 256 --input-len 108 --output-len 128 --ignore-eos --quiet --json $o/ceiling-$n.json >/dev/null 2>&1; py $o/ceiling-$n.json "client ceiling (stub) n=$n c=256:"
  timeout 120 $B bench engine --device cuda --load-format dummy --model $M --num-prompts $n --input-len 108 --min-input-len 108 --output-len 128 --min-output-len 128 --max-num-seqs 256 > $o/engine-$n.txt 2>&1; echo "bench engine n=$n: $(grep -E 'throughput|decode phase' $o/engine-$n.txt | tr '\n' ' ')"
done
$B up --device cuda --model $M --load-format dummy --port $port > $o/up.out 2> $o/up.log &
pid=$!
for _ in $(seq 1 900); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
grep -m1 "Tandem is serving" $o/up.log || tail -5 $o/up.log
$B bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2-meta --seed 99 --num-prompts 64 --concurrency 64 --input-len 108 --output-len 128 --ignore-eos --quiet --json $o/warm.json >/dev/null 2>&1
for n in 256 1024; do
  # A seed per run: no run finds another's prompts in the prefix cache.
  $B bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2-meta --seed $n --num-prompts $n --concurrency 256 --input-len 108 --output-len 128 --ignore-eos --quiet --json $o/up-$n.json >/dev/null 2>&1; py $o/up-$n.json "tandem up (defaults) n=$n c=256:"
done
kill -INT $pid; wait $pid 2>/dev/null
tar czf $OUT/serve.tgz -C $OUT serve
