#!/usr/bin/env bash
# KV block size 16 / 32 / 64 / 128 positions: decode steps and nano-vllm's workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
dq() { local n="$1"; shift; timeout 150 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$? $(grep -E 'decode .* step' $L/$n.log | sed -E 's/^\[[^]]*\] //' | grep -oE 'batch +[0-9]+|step [0-9.]+ ms, [0-9.]+ GB read, roofline [0-9.]+ ms -> [0-9.]+%' | tr '\n' ' ')"; }
for b in 16 64 32 128 16 64; do dq l8b-bs$b TANDEM_BLOCK_SIZE=$b $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024; done
for b in 16 64 32; do dq qwen3-bs$b TANDEM_BLOCK_SIZE=$b $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,64,128,256 100-2048; done
dq l8b-copy-bs16 TANDEM_BLOCK_SIZE=16 TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY $g bench-decode .gpu/bin/configs/llama-3-8b.json 64 1024
dq l8b-copy-bs64 TANDEM_BLOCK_SIZE=64 TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY $g bench-decode .gpu/bin/configs/llama-3-8b.json 64 1024
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; }
eng bs16-1 TANDEM_BLOCK_SIZE=16; eng bs64-1 TANDEM_BLOCK_SIZE=64; eng bs16-2 TANDEM_BLOCK_SIZE=16; eng bs64-2 TANDEM_BLOCK_SIZE=64; eng bs32-1 TANDEM_BLOCK_SIZE=32
tar czf $OUT/logs.tgz -C $L .
