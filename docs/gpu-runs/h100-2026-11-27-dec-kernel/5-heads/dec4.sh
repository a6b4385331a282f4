#!/usr/bin/env bash
# The small-tile decode kernel with several KV heads per CTA (TANDEM_DEC_HEADS) and 1 or 2 warps
# per head (TANDEM_DEC_WARPS): do CTAs that read a block's neighbouring 4 KB runs together
# read faster? Checks for each, decode steps, the copies alone.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
summ() { grep -E "decode .* step" "$1" | grep -v 16-row | sed -E 's/^\[[^]]*\] //' | cut -c1-110; grep -E "eager" "$1" | grep -oE "attention [0-9.]+ ms" | tr '\n' ' '; echo; }
for c in "2 1" "1 4" "1 8" "2 4" "1 1"; do set -- $c; export TANDEM_DEC_WARPS=$1 TANDEM_DEC_HEADS=$2
  $g info 2>&1 | grep dec128
  $g check bf16 > $L/check-w$1-h$2.log 2>&1; echo "check w$1 h$2 rc=$? $(grep -c PASS $L/check-w$1-h$2.log) pass $(grep -c FAIL $L/check-w$1-h$2.log) fail"
  timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-w$1-h$2.log 2>&1; echo "== 8b w$1 h$2"; summ $L/decode-8b-w$1-h$2.log
  timeout 200 $g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,256 100-2048 > $L/decode-qwen3-w$1-h$2.log 2>&1; echo "== qwen3 w$1 h$2"; summ $L/decode-qwen3-w$1-h$2.log
done
for c in "1 8" "2 1"; do set -- $c; export TANDEM_DEC_WARPS=$1 TANDEM_DEC_HEADS=$2
  TANDEM_CUDA_DEFINES=TANDEM_DEC_COPY_ONLY timeout 200 $g bench-decode .gpu/bin/configs/llama-3-8b.json 64,256 1024 > $L/decode-8b-copy-w$1-h$2.log 2>&1; echo "== 8b copies only w$1 h$2"; summ $L/decode-8b-copy-w$1-h$2.log
done
tar czf $OUT/logs.tgz -C $L .
