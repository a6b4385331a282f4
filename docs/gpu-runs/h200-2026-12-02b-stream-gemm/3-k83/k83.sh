#!/usr/bin/env bash
# One H200: the tree as committed (products of 2–32 rows on gemm_stream, the default): the
# checks, the decode step of Qwen3-0.6B at 1–64 sequences and of the Llama-3-8B shape at 1–32
# (bench-decode prints the all-cuBLAS step beside each), the engine with and without
# (TANDEM_STREAM_GEMM=off).
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; Q=$C/configs/qwen3-0.6b.json; E=$C/configs/llama-3-8b.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
chk() { # dtype
  timeout 200 $g check $1 > $L/check-$1.log 2>&1; echo "$(el) check $1 rc=$? pass=$(grep -c PASS $L/check-$1.log) fail=$(grep -c FAIL $L/check-$1.log)"
  grep -E 'FAIL' $L/check-$1.log | cut -c1-150
}
dec() { # tag cfg batches contexts
  timeout 250 $g bench-decode $2 $3 $4 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')"
  echo "   cuBLAS: $(grep -E "instead of Tandem" $L/decode-$1.log | sed -E 's/.*step ([0-9.]+) ms, ([0-9.]+)%.*/\1 (\2%)/' | tr '\n' ' ')"
}
eng() { # tag env args...
  local tag=$1 e=$2; shift 2
  env $e timeout 100 $t bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag.log 2>&1
  echo "$(el) $tag rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-$tag.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
N="--model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384"
G16="--model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0"
G32="--model $Q --num-prompts 32 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 32 --temperature 0"
chk f16
dec Q $Q 1,2,4,8,16,24,32,64 100-2048
dec E $E 1,2,8,16,32 1024
eng long16-on X=1 $G16; eng long16-off TANDEM_STREAM_GEMM=off $G16
eng long32-on X=1 $G32; eng long32-off TANDEM_STREAM_GEMM=off $G32
eng nano-on X=1 $N; eng nano-off TANDEM_STREAM_GEMM=off $N
echo "$(el) done"
