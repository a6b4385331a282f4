#!/usr/bin/env bash
# k138: at 64 sequences the 8B shape's attention read 2,652 GB/s (2 context splits, 512
# positions a CTA), at 256 2,997 GB/s (1 split, 1,024). The split rule (plan::attention_splits)
# against TANDEM_SPLIT_CTAS_PER_SM=2 (one split where the tiles x KV heads fill 2 CTAs an SM:
# fewer, longer splits at 32-64 sequences), alternating; bench-decode graph replays.
source scripts/gpu/session.sh
for r in 1 2; do
  for v in default ctas2; do
    e=(); [ $v = ctas2 ] && e=(env TANDEM_SPLIT_CTAS_PER_SM=2)
    g0=$g; g="${e[*]} $g0"
    dec l8b-$v-$r $E 16,32,48,64,128,256 1024
    dec q3-$v-$r $Q 32,48,64,128,192 100-2000
    g=$g0
  done
done
finish
