#!/usr/bin/env bash
# One H200: products of 2–64 rows on the gemm_stream kernels (the default on sm_90) against
# cuBLAS (TANDEM_STREAM_GEMM=off), same binary: the kernel checks, each decode GEMM alone
# (bench-gemm), the decode step at 1–256 sequences (bench-decode prints the step with every
# product on cuBLAS beside it), nano-vllm's workload and 16 greedy requests both ways, e2e;
# and the gated epilogue (gate|up + activation in one kernel) off (TANDEM_GEMM_GLU=off), whose
# digests must equal the default's (the same bits by construction).
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; Q=$C/configs/qwen3-0.6b.json; S=$C/configs/smollm2-135m-shape.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
chk() { # dtype
  timeout 200 $g check $1 > $L/check-$1.log 2>&1; echo "$(el) check $1 rc=$? pass=$(grep -c PASS $L/check-$1.log) fail=$(grep -c FAIL $L/check-$1.log)"
  grep -E 'FAIL|gemm' $L/check-$1.log | cut -c1-150
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
G="--model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0"
chk bf16
dec Q $Q 1,2,8,16,32,64,128,256 100-2048
timeout 120 $g bench-gemm $Q 2,8,16,32,64 > $L/gemm-Q.log 2>&1; echo "$(el) bench-gemm Q rc=$?"
grep -E 'gemm_stream|all shapes' $L/gemm-Q.log | sed -E 's/^\[[^]]*\] *//' | cut -c1-160
eng nano-on X=1 $N; eng nano-off TANDEM_STREAM_GEMM=off $N; eng nano-glu-off TANDEM_GEMM_GLU=off $N
# The gated epilogue off: gate|up to memory and the silu_mul kernel, products still streamed.
TANDEM_GEMM_GLU=off dec Q-glu-off $Q 16,64 100-2048
dec S $S 1,8,64,256 100-300
# Slices of k: fewer (1 CTA an SM) and more (3) than the default 1.5.
for f in 1 3; do TANDEM_STREAM_GEMM_FILL=$f dec Q-fill$f $Q 16,64 100-2048; done
eng long16-on X=1 $G; eng long16-off TANDEM_STREAM_GEMM=off $G; eng long16-glu-off TANDEM_GEMM_GLU=off $G
python3 scripts/gpu/make_llama_shape.py /tmp/llama-hd128 128 > /dev/null 2>&1
timeout 150 $g e2e /tmp/llama-hd128 f16 > $L/e2e-hd128.log 2>&1; echo "$(el) e2e hd128 rc=$? pass=$(grep -c PASS $L/e2e-hd128.log) fail=$(grep -c FAIL $L/e2e-hd128.log)"
grep FAIL $L/e2e-hd128.log | head -5
chk f16
timeout 60 $g bench-gemm $S 8,64 > $L/gemm-S.log 2>&1; echo "$(el) bench-gemm S rc=$?"
grep -E 'gemm_stream|all shapes' $L/gemm-S.log | sed -E 's/^\[[^]]*\] *//' | cut -c1-160
echo "$(el) done"
