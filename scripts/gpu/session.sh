# Helpers for one device run's script (sourced on the GPU host, in the repository root): unpack
# the binaries carried in .gpu/c (tandem-gpu.xz, tandem.xz, configs/, w.json; see docs/gpu-benchmarks.md),
# then run sections whose one-line summaries go to stdout and whose logs go to $OUT/logs.
#
#   source scripts/gpu/session.sh
#   chk bf16                                  tandem-gpu check, PASS/FAIL counts and the failures
#   dec TAG CFG BATCHES CONTEXTS              bench-decode: each batch's step, % of the roofline,
#                                             and the step with every product on cuBLAS
#   eng TAG ARGS...                           tandem bench engine (dummy weights on CUDA): tok/s,
#                                             steps, the outputs' digest
#   gem TAG CFG BATCHES                       bench-gemm: cuBLAS against Tandem's kernels, per shape
#   kinds TAG                                 an `eng` section's steps by kind
#   served_ab TAG...                          served rounds of tandem-base and the new binary, by
#                                             tag (base-1 new-1 ...); prefill8b: the 8B prefill
#   served [ROUNDS]                           peer.sh's served rounds (tandem up against bench
#                                             engine, 2,048 requests of 108 + 128 at 256 streams;
#                                             STEP_LOG=1: the worker's steps by kind too)
#   finish                                    the logs packed into $OUT/logs.tar.xz (last)
# Environment for one section: `VAR=value dec ...` (a function sees its caller's assignments).
set -u
C=.gpu/c
mkdir -p .gpu/bin .gpu/tandem
xz -dc $C/tandem-gpu.xz > .gpu/bin/tandem-gpu && xz -dc $C/tandem.xz > .gpu/tandem/tandem
chmod +x .gpu/bin/tandem-gpu .gpu/tandem/tandem
g=.gpu/bin/tandem-gpu; t=.gpu/tandem/tandem
Q=$C/configs/qwen3-0.6b.json; E=$C/configs/llama-3-8b.json; S=$C/configs/smollm2-135m-shape.json
L=$OUT/logs; mkdir -p $L; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader

chk() { # dtype
  timeout 200 $g check $1 > $L/check-$1.log 2>&1
  echo "$(el) check $1 rc=$? pass=$(grep -c PASS $L/check-$1.log) fail=$(grep -c FAIL $L/check-$1.log)"
  grep -E 'FAIL' $L/check-$1.log | cut -c1-160
}
dec() { # tag cfg batches contexts
  timeout 200 $g bench-decode $2 $3 $4 > $L/decode-$1.log 2>&1
  local rc=$?
  echo "$(el) $1 rc=$rc: $(grep -E '\] decode .* step' $L/decode-$1.log | sed -E 's/.*batch +([0-9]+).*step ([0-9.]+) ms.*-> ([0-9.]+)%.*/b\1 \2 (\3%)/' | tr '\n' ' ')"
  echo "   all cuBLAS: $(grep -E 'instead of Tandem' $L/decode-$1.log | sed -E 's/.*step ([0-9.]+) ms, ([0-9.]+)%.*/\1 (\2%)/' | tr '\n' ' ')"
}
eng() { # tag args...
  local tag=$1; shift
  timeout 150 $t bench engine --device cuda --load-format dummy "$@" > $L/engine-$tag.log 2>&1
  echo "$(el) $tag rc=$?: $(grep -E '^throughput|digest|^steps' $L/engine-$tag.log | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
gem() { # tag cfg batches
  timeout 120 $g bench-gemm $2 $3 > $L/gemm-$1.log 2>&1
  echo "$(el) bench-gemm $1 rc=$?"
  grep -E '\] gemm .* m=|20 different' $L/gemm-$1.log | paste - - \
    | sed -E 's/.*m= *([0-9]+) n= *([0-9]+) k= *([0-9]+).*20 different weight matrices: ([^;]*);.*/  \1x\2x\3: \4/'
  grep -E 'all shapes' $L/gemm-$1.log | sed -E 's/.*all shapes: //'
}
kinds() { # tag
  grep -A7 "^steps by kind" $L/engine-$1.log | tail -n +2 | grep -E "^  (with|decode)" | cut -c1-250
}
served() { # rounds
  mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
  OUT=$L/served LLAMA=0 TABLE=0 ROUNDS=${1:-2} PLACEMENTS=${PLACEMENTS:-shared} ROUND_PROMPTS=${ROUND_PROMPTS:-2048} timeout 170 bash scripts/gpu/peer.sh run > $L/peer.log 2>&1
  echo "$(el) served rc=$?"; grep -E "tandem up, client|^round|decode worker|hand-offs|steps by|step log|with prompts| decode [0-9]|by mean context|window|TTFT mean|client ceiling" $L/peer.log | cut -c1-400
  rm -f $L/served/peer/*.gguf
  # Every mixed-step graph capture (rows, logits rows, ms) kept before the log is cut.
  for f in $L/served/peer/round*-up-shared.log; do [ -f $f ] && { sed 's/\x1b\[[0-9;]*m//g' $f | grep "captured a mixed-step graph" > ${f%.log}-captures.txt; grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
}
# The 8B 4 x 2,048 prefill against the GEMM peak (a Must-show figure of issue 30).
prefill8b() {
  timeout 200 $g bench-prefill $E 4 2048 > $L/prefill-8b.log 2>&1
  echo "$(el) prefill rc=$?"; grep -E "prefill llama" $L/prefill-8b.log | cut -c1-200
}
# Served rounds of two binaries in the order of the tags (`served_ab base-1 new-1 new-2 base-2`):
# tandem-base from $C/tandem-base.xz against the carried tandem (new), one round each.
served_ab() {
  [ -x .gpu/tandem/tandem-new ] || cp .gpu/tandem/tandem .gpu/tandem/tandem-new
  xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
  for tag in "$@"; do
    cp .gpu/tandem/tandem-${tag%-*} .gpu/tandem/tandem
    echo "== $tag"; served 1
    mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
  done
  cp .gpu/tandem/tandem-new .gpu/tandem/tandem
}
# nano-vllm's workload and long greedy requests (Qwen3-0.6B shape), for `eng TAG $NANO` etc.
NANO="--model $Q --workload-file $C/w.json --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384"
G16="--model $Q --num-prompts 16 --input-len 2048 --min-input-len 300 --output-len 200 --min-output-len 200 --max-num-seqs 16 --temperature 0"
# The logs as one file (a run brings back only a few files from $OUT): call last.
finish() {
  tar -cJf $OUT/logs.tar.xz -C $OUT logs && rm -rf $OUT/logs
  echo "$(el) done"
}
