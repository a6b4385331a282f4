#!/usr/bin/env bash
# One H200: the engine (async step overlap, sampling on the device) on workloads whose steps
# carry a few prompts beside decoding sequences (lengths drawn over a range, so sequences
# finish and new ones start at different steps), new (mixed-step graphs) vs the tree before:
# the outputs digest must match and the throughput is compared without a client.
set -u
t=.gpu/tandem/tandem; o=.gpu/pack/old-tandem; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
run() { # tag args...
  local tag=$1; shift
  for r in 1 2; do for v in new old; do b=$t; [ $v = old ] && b=$o
    timeout 120 $b bench engine --device cuda "$@" > $L/engine-$tag-$v-r$r.log 2>&1
    echo "$tag $v r$r rc=$?: $(grep -E 'throughput|digest|^steps|per step' $L/engine-$tag-$v-r$r.log | tr -s ' ' | cut -c1-80 | tr '\n' ';')"
  done; done
}
run tiny-greedy --model tests/data/tiny-llama --temperature 0 --num-prompts 512 --input-len 100 --min-input-len 4 --output-len 64 --min-output-len 4 --max-num-seqs 64 --max-num-batched-tokens 512
run smol-mixed --load-format dummy --model $S --dtype f16 --num-prompts 4096 --input-len 160 --min-input-len 16 --output-len 256 --min-output-len 16 --max-num-seqs 256 --max-num-batched-tokens 1024
run qwen3-mixed --load-format dummy --model $Q --num-prompts 1024 --input-len 512 --min-input-len 16 --output-len 256 --min-output-len 16 --max-num-seqs 128 --max-num-batched-tokens 1024 --temperature 0.6
tar czf $OUT/logs.tgz -C $L .
