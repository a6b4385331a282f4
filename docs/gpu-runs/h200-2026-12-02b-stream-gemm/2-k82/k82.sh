#!/usr/bin/env bash
# One H200: the stream GEMM's rule after k81 — products of 2 to TANDEM_STREAM_GEMM_MAX_ROWS rows
# (default 16) on gemm_stream, slices of k any whole number of stages (the SmolLM2 shape's 9
# stages in 3), one CTA an SM (TANDEM_STREAM_GEMM_FILL=1): the checks, the decode step at 1–64
# sequences with the limit at 16, 32 and 64 (bench-decode prints the all-cuBLAS step beside
# each), the engine on and off.
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; Q=$C/configs/qwen3-0.6b.json; S=$C/configs/smollm2-135m-shape.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
chk() { # dtype
  timeout 200 $g check $1 > $L/check-$1.log 2>&1; echo "$(el) check $1 rc=$? pass=$(grep -c PASS $L/check-$1.log) fail=$(grep -c FAIL $L/check-$1.log)"
  grep -E 'FAIL' $L/check-$1.log | cut -c1-150
}
dec() { # tag cfg batches contexts
  timeout 200 $g bench-decode $2 $3 $4 > $L/decode-$1.log 2>&1
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
G8="--model $Q --num-prompts 8 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 8 --temperature 0"
chk bf16
for r in 1 2; do
  dec Q-r$r $Q 1,2,4,8,16,32,64 100-2048
  TANDEM_STREAM_GEMM_MAX_ROWS=64 dec Q-rows64-r$r $Q 32,64 100-2048
done
TANDEM_STREAM_GEMM_MAX_ROWS=64 TANDEM_STREAM_GEMM_FILL=0.5 dec Q-rows64-fill05 $Q 32,64 100-2048
dec S $S 1,2,8,16,64 100-300
TANDEM_STREAM_GEMM_MAX_ROWS=64 dec S-rows64 $S 32,64 100-300
for r in 1 2; do
  eng long16-on-r$r X=1 $G16; eng long16-off-r$r TANDEM_STREAM_GEMM=off $G16
  eng long8-on-r$r X=1 $G8; eng long8-off-r$r TANDEM_STREAM_GEMM=off $G8
done
eng nano-on X=1 $N; eng nano-off TANDEM_STREAM_GEMM=off $N
timeout 120 $g bench-gemm $S 2,8,16 > $L/gemm-S.log 2>&1; echo "$(el) bench-gemm S rc=$?"
grep -E 'gemm_stream|all shapes' $L/gemm-S.log | sed -E 's/^\[[^]]*\] *//' | cut -c1-110
python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd64 64 > /dev/null 2>&1
timeout 150 $g e2e /tmp/llama-hd64 f16 > $L/e2e-hd64.log 2>&1; echo "$(el) e2e hd64 rc=$? pass=$(grep -c PASS $L/e2e-hd64.log) fail=$(grep -c FAIL $L/e2e-hd64.log)"
echo "$(el) done"
