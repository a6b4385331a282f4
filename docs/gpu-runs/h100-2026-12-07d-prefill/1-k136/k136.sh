#!/usr/bin/env bash
# Binaries of 1dea27f4. Where a prompt step of nano-vllm's workload goes (its 9 steps of ~16k
# prompt tokens ran at ~36 % of the GEMM peak against the 8B shape's 69.5 %): bench-prefill on the
# Qwen3-0.6B shape at the workload's mean prompt (29 x 562 ~ its 16,384-token steps), at 16 x 1,024
# and 4 x 2,048, with the eager stages; then k135 (the decode worker's environment as
# `tandem up --device cuda` starts it, and one served round, every core).
source scripts/gpu/session.sh
for s in "29 562" "16 1024" "4 2048" "160 100"; do
  set -- $s
  timeout 120 $g bench-prefill $Q $1 $2 > $L/prefill-q-$1x$2.log 2>&1
  echo "$(el) prefill $1x$2 rc=$?"; grep -E "prefill qwen|eager" $L/prefill-q-$1x$2.log | cut -c1-900
done
(for i in $(seq 90); do
   p=$(pgrep -f " decode --listen" | head -1)
   [ -n "$p" ] && { echo "decode worker $p: $(tr '\0' '\n' < /proc/$p/environ | grep -E '^(GLIBC_TUNABLES|TANDEM_RUNTIME_THREADS)=' | tr '\n' ' ')"; break; }
   sleep 1
 done) &
served 1
wait
finish
