#!/usr/bin/env bash
# One H200, the evict-first build: decode steps with two (default) and three pipeline stages
# (TANDEM_MMA_STAGES=3) over more batch sizes, to see where three pages a warp pay.
set -u
g=.gpu/bin/tandem-gpu; C=.gpu/bin/configs
S=$C/smollm2-135m-shape.json; Q=$C/qwen3-0.6b.json; B=$C/llama-3-8b.json
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
run() { # tag shape batches ctx env...
  local tag=$1 cfg=$2 bs=$3 ctx=$4; shift 4
  timeout 200 env "$@" $g bench-decode $cfg $bs $ctx > $L/decode-$tag.log 2>&1
  echo "$tag rc=$?: $(grep -E 'decode .* step' $L/decode-$tag.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2/' | tr '\n' ' ')"
}
for r in 1 2; do
  run Q-s2-r$r $Q 16,32,48,64,96,128,192,256 100-2048 X=1
  run Q-s3-r$r $Q 16,32,48,64,96,128,192,256 100-2048 TANDEM_MMA_STAGES=3
done
run B-s2 $B 16,32,64,128,256 1024 X=1
run B-s3 $B 16,32,64,128,256 1024 TANDEM_MMA_STAGES=3
run Q1k-s2 $Q 16,32,64,128,256 1024 X=1
run Q1k-s3 $Q 16,32,64,128,256 1024 TANDEM_MMA_STAGES=3
tar czf $OUT/logs.tgz -C $L .
