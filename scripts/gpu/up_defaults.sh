#!/usr/bin/env bash
# `tandem up --device cuda` with its defaults on one GPU (colocated) against --disaggregated:
# 1, 32 and 256 concurrent streams of 108 + 128 tokens through `tandem bench serve`.
# Expects the binary at .gpu/tandem/tandem and a metadata-only GGUF (scripts/gpu/gguf_metadata_only.py)
# at .gpu/bin/smollm2-meta.gguf, as carried to a device host; B= and M= override them.
set -u
B=${B:-.gpu/tandem/tandem}; M=${M:-.gpu/bin/smollm2-meta.gguf}; port=${PORT:-18000}
nvidia-smi --query-gpu=name --format=csv,noheader
for mode in default disaggregated; do
  flags=(); [ $mode = disaggregated ] && flags=(--disaggregated --gpu-memory-utilization 0.4)
  $B up --device cuda --model $M --load-format dummy --port $port "${flags[@]}" > /tmp/up-$mode.out 2> /tmp/up-$mode.log &
  pid=$!
  for _ in $(seq 1 900); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  grep -m1 "Tandem is serving" /tmp/up-$mode.log || { tail -5 /tmp/up-$mode.log; continue; }
  for c in 1 32 256; do
    $B bench serve --base-url http://127.0.0.1:$port/v1 --model smollm2-meta --num-prompts $((c>32?c:32)) --concurrency $c \
      --input-len 108 --output-len 128 --ignore-eos --quiet --label $mode-$c --json /tmp/$mode-$c.json >/dev/null 2>&1
    python3 -c "
import json; r=json.load(open('/tmp/$mode-$c.json'))['result']
print('$mode c=$c: out %.0f tok/s, TTFT p50 %.1f p99 %.1f ms, failed %d' % (r['output_throughput'], r['ttft']['median_ms'], r['ttft']['p99_ms'], r['failed']))"
  done
  kill -INT $pid; wait $pid 2>/dev/null
done
