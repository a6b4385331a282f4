#!/usr/bin/env bash
# Binaries of 1dea27f4 (tandem up --device cuda gives its services glibc's deeper thread cache):
# the decode worker's environment as `tandem up` started it, and one served round, every core.
source scripts/gpu/session.sh
(for i in $(seq 90); do
   p=$(pgrep -f " decode --listen" | head -1)
   [ -n "$p" ] && { echo "decode worker $p: $(tr '\0' '\n' < /proc/$p/environ | grep -E '^(GLIBC_TUNABLES|TANDEM_RUNTIME_THREADS)=' | tr '\n' ' ')"; break; }
   sleep 1
 done) &
served 1
wait
finish
