#!/usr/bin/env bash
# Four NVIDIA H200, the final tree: tensor parallelism at TP=4 with dependent launches (default)
# and without (TANDEM_PDL=off) — tp-check at TP=4, the 70B shape's TP=4 and TP=2 decode.
set -u
export NCCL_NVLS_ENABLE=0
g=.gpu/bin/tandem-gpu
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $L/smi.log
for m in tests/data/tiny-llama tests/data/tiny-qwen3 .gpu/bin/configs/llama-3-8b.json; do n=$(basename $m .json); timeout 300 $g tp-check $m 4 8 64 > $L/tp4-$n.log 2>&1; echo "tp4-check $n rc=$? $(tail -1 $L/tp4-$n.log | cut -c1-100)"; done
dec() { local n="$1" cfg="$2" b="$3" c="$4" tp="$5" rs="$6"; for r in $rs; do for v in on off; do local f=$L/decode-$n-$v-$r.log; if [ $v = off ]; then e=TANDEM_PDL=off; else e=X=1; fi; timeout 200 env $e $g bench-decode $cfg $b $c $tp > $f 2>&1; echo "$n $v $r: $(grep -E 'decode .* step' $f | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+%).*/b\1 \2 \3/' | tr '\n' ' ')"; done; done; }
dec l70b-tp4 .gpu/bin/configs/llama-3-70b.json 1,16,64,256 1024 4 "1"
dec l70b-tp2 .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 "1"
tar czf $OUT/logs.tgz -C $L .
