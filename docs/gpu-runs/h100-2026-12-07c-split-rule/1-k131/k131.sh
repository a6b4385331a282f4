#!/usr/bin/env bash
# Binaries of this stop's tree: the attention split rule's new default (about two CTAs an SM, or
# up to four where three pieces or fewer get there) against the old one (TANDEM_SPLIT_CTAS_PER_SM=2
# aims at exactly two), alternating, on the decode steps of k130; nano-vllm's workload twice;
# served rounds (with the router's streamed text chunks written without a JSON tree) on every
# core and on cores 0-3.
source scripts/gpu/session.sh
chk bf16
for r in 1 2; do
  dec q3-new-$r $Q 16,32,48,64,96,128 1024
  TANDEM_SPLIT_CTAS_PER_SM=2 dec q3-old-$r $Q 16,32,48,64,96,128 1024
  dec l8b-new-$r $E 16,32,64,128 1024
  TANDEM_SPLIT_CTAS_PER_SM=2 dec l8b-old-$r $E 16,32,64,128 1024
done
dec q3v-new $Q 32,64,128 100-2048
TANDEM_SPLIT_CTAS_PER_SM=2 dec q3v-old $Q 32,64,128 100-2048
for r in 1 2; do eng nano-$r $NANO; kinds nano-$r; done
for r in 1 2; do served 1; mv $L/served $L/served-all-$r; mv $L/peer.log $L/served-all-$r/; done
for r in 1 2; do
  taskset -c 0-3 bash -c "source scripts/gpu/session.sh >/dev/null; served 1"
  mv $L/served $L/served-4cores-$r 2>/dev/null; mv $L/peer.log $L/served-4cores-$r/ 2>/dev/null
done
finish
