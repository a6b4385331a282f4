#!/usr/bin/env bash
# Two NVIDIA H200: programmatic dependent launch under tensor parallelism (the peer all-reduce
# kernels as dependents of the GEMMs) — tp checks against one GPU, the 70B shape's TP=2 decode
# with and without (TANDEM_PDL=off); and the 8B shape at batch 16/64 on one GPU, repeated.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
dec() { local n="$1" cfg="$2" b="$3" c="$4" tp="$5" rs="$6"; for r in $rs; do for v in on off; do local f=$L/decode-$n-$v-$r.log; if [ $v = off ]; then e=TANDEM_PDL=off; else e=X=1; fi; timeout 200 env $e $g bench-decode $cfg $b $c $tp > $f 2>&1; echo "$n $v $r: $(grep -E 'decode .* step' $f | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2 \3/' | tr '\n' ' ')"; done; done; }
dec l8b .gpu/bin/configs/llama-3-8b.json 16,64 1024 1 "1 2 3"
for m in tests/data/tiny-llama tests/data/tiny-qwen3 tests/data/tiny-phi3; do timeout 120 $g tp-check $m 2 8 64 > $L/tp-$(basename $m).log 2>&1; echo "tp-check $(basename $m) rc=$? $(tail -1 $L/tp-$(basename $m).log | cut -c1-100)"; done
timeout 300 $g tp-check .gpu/bin/configs/llama-3-8b.json 2 8 64 > $L/tp-8b.log 2>&1; echo "tp-check 8b rc=$? $(tail -1 $L/tp-8b.log | cut -c1-100)"
dec l70b-tp2 .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 "1"
tar czf $OUT/logs.tgz -C $L .
