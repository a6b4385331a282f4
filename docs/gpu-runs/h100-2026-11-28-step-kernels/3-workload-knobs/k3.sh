#!/usr/bin/env bash
# The workload against the tree before (alternating), the decode attention's knobs on mixed
# contexts, and one step's kernels with the residual projections cut in 4.
set -u
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem; og=.gpu/old/tandem-gpu; ot=.gpu/old/tandem
L=/tmp/logs; mkdir -p $L
nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv | tee $L/smi.log
python3 scripts/gpu/hf_baseline.py --dump-workload /tmp/w.json > /dev/null 2>&1
eng() { local n="$1" b="$2"; shift 2; local f=$L/engine-$n.log; timeout 200 env "$@" $b bench engine --device cuda --load-format dummy --model .gpu/bin/configs/qwen3-0.6b.json --workload-file /tmp/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 > $f 2>&1; echo "engine-$n: $(grep -E 'throughput|digest|per step' $f | tr -s ' ' | cut -c1-90 | tr '\n' ';')"; }
eng new-1 $t X=1; eng old-1 $ot X=1; eng new-2 $t X=1; eng old-2 $ot X=1
dec() { local n="$1"; shift; timeout 200 env "$@" > $L/$n.log 2>&1; echo "== $n rc=$?"; grep -E "decode .* step" $L/$n.log | sed -E 's/^\[[^]]*\] //' | cut -c1-110; }
D="$g bench-decode .gpu/bin/configs/qwen3-0.6b.json 32,64,128 100-2048"
dec knob-default X=1 $D
dec knob-ctas4 TANDEM_SPLIT_CTAS_PER_SM=4 $D
dec knob-ctas8 TANDEM_SPLIT_CTAS_PER_SM=8 $D
dec knob-stages3 TANDEM_MMA_STAGES=3 $D
dec knob-warps4 TANDEM_DEC_WARPS=4 $D
TANDEM_SPLIT_K=4 timeout 200 python3 scripts/gpu/step_kernels.py --bin $g .gpu/bin/configs/qwen3-0.6b.json 64 100-2048 > $L/kernels-b64-splitk4.log 2>&1; head -20 $L/kernels-b64-splitk4.log | cut -c1-110
timeout 200 python3 scripts/gpu/step_kernels.py --bin $g .gpu/bin/configs/qwen3-0.6b.json 64 100-2048 > $L/kernels-b64.log 2>&1; head -20 $L/kernels-b64.log | cut -c1-110
tar czf $OUT/logs.tgz -C $L .
