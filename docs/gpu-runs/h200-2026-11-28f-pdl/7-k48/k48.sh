#!/usr/bin/env bash
# One NVIDIA H200: the RMSNorm kernels plain only right after a cuBLAS GEMM (dependents after
# Tandem's own kernels, as at batch 1 behind `gemv`), the attention kernels always plain, against
# plain launches (TANDEM_PDL=off): checks, decode steps of three shapes, nano-vllm's workload.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for d in bf16 f16; do timeout 200 $g check $d > $L/check-$d.log 2>&1; echo "check-$d rc=$? $(grep -c PASS $L/check-$d.log) pass $(grep -c FAIL $L/check-$d.log) fail"; done
for m in tiny-llama tiny-qwen3; do timeout 120 $g e2e tests/data/$m f16 > $L/e2e-$m.log 2>&1; echo "e2e-$m rc=$? $(grep -c PASS $L/e2e-$m.log) pass $(grep -c FAIL $L/e2e-$m.log) fail"; done
S=docs/gpu-runs/h100-2026-11-28-step-kernels/1-ncu/smollm2-135m-shape.json
dec() { local n="$1" cfg="$2" b="$3" c="$4" rs="$5"; for r in $rs; do for v in on off; do local f=$L/decode-$n-$v-$r.log; if [ $v = off ]; then e=TANDEM_PDL=off; else e=X=1; fi; timeout 150 env $e $g bench-decode $cfg $b $c > $f 2>&1; echo "$n $v $r: $(grep -E 'decode .* step' $f | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2 \3/' | tr '\n' ' ')"; done; done; }
dec qwen3 .gpu/bin/configs/qwen3-0.6b.json 1,16,64,256 100-2048 "1 2"
dec smollm2 $S 1,16,64,256 100-300 "1 2"
dec l8b .gpu/bin/configs/llama-3-8b.json 1,16,64 1024 "1 2"
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1"; shift; local f=$L/engine-$n.log; timeout 100 env "$@" $t bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest' $f | tr -s ' ' | cut -c1-110 | tr '\n' ';')"; }
for r in 1 2; do eng on-$r X=1; eng off-$r TANDEM_PDL=off; done
tar czf $OUT/logs.tgz -C $L .
