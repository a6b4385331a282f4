#!/usr/bin/env bash
# One H200: which one-row products the gemv kernel should take. At one sequence the Llama-3-8B
# shape's step was 4.684 ms on gemv against 4.509 on cuBLAS (k83). bench-gemm times each of its
# layer products at one row both ways; then the step of the 8B, Qwen3-0.6B and SmolLM2 shapes
# at one sequence with gemv limited to matrices of at most TANDEM_GEMV_MAX_MB (unset: any).
set -u
C=.gpu/c; mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu; xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; Q=$C/configs/qwen3-0.6b.json; E=$C/configs/llama-3-8b.json; S=$C/configs/smollm2-135m-shape.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
timeout 120 $g bench-gemm $E 1 > $L/gemm-E.log 2>&1; echo "$(el) bench-gemm E rc=$?"
grep -E 'gemm .* m=|gemv kernel' $L/gemm-E.log | sed -E 's/^\[[^]]*\] *//' | cut -c1-120
dec() { # tag cfg contexts
  timeout 100 $g bench-decode $2 1 $3 > $L/decode-$1.log 2>&1
  echo "$(el) $1 rc=$?: $(grep -E 'decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ') cuBLAS: $(grep -E "instead of Tandem" $L/decode-$1.log | sed -E 's/.*step ([0-9.]+) ms, ([0-9.]+)%.*/\1 (\2%)/' | tr '\n' ' ')"
}
for r in 1 2; do
  for mb in any 512 128 40; do
    if [ $mb = any ]; then unset TANDEM_GEMV_MAX_MB; else export TANDEM_GEMV_MAX_MB=$mb; fi
    dec E-$mb-r$r $E 1024; dec Q-$mb-r$r $Q 100-2048; dec S-$mb-r$r $S 100-300
  done
done
echo "$(el) done"
