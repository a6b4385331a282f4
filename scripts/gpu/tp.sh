#!/usr/bin/env bash
# Tensor parallelism on a host with two GPUs or more (after `scripts/gpu/run.sh build`):
#
#   scripts/gpu/tp.sh [SECTIONS]    any of: check bench disagg (default: all three)
#
# check   TP=2 (and TP=4 on a host of four GPUs) against one GPU on the same weights, greedy
#         token for token (tandem-gpu tp-check):
#         the committed tiny random-weight models of each CUDA architecture (their files, so the
#         sharded loader runs) and the Llama-3-8B shape (random weights from a fixed seed), with
#         the peer-memory all-reduce and again with NCCL's (TANDEM_TP_ALL_REDUCE=nccl); a copy of
#         the tiny Llama with one KV head (scripts/gpu/one_kv_head.py), replicated on both GPUs.
# bench   the Llama-3-70B shape (random weights) split over GPUs 0 and 1: decode steps at batch
#         1, 64 and 256 (context 1024) against the two-GPU HBM roofline measured in the same run,
#         the step's all-reduces alone in a graph; with the peer-memory all-reduce carrying
#         the RMSNorm after it, with the two apart, and with NCCL's; prefill 4 x 2048 against
#         both GPUs' GEMM peak.
# disagg  a TP=1 prefill worker feeding a TP=2 decode worker against the TP=2 worker colocated
#         (scripts/gpu/disagg.sh tp).
#
# Logs go to $OUT/tp (default .gpu/out/tp). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/../.."
sections="${1:-check bench disagg}"
bin=.gpu/bin
out="${OUT:-.gpu/out}/tp"
mkdir -p "$out"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
g="$bin/tandem-gpu"
fail=0
section() { # name limit-seconds args...
  local name="$1" limit="$2"; shift 2
  echo "== $name: tandem-gpu $*"
  timeout -k 5 "$limit" "$g" "$@" 2>&1 | tee "$out/$name.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
}
nvidia-smi --query-gpu=index,name,memory.total --format=csv 2>&1 | tee "$out/smi.log"
for s in $sections; do
  case "$s" in
    check)
      for arch in llama qwen2 qwen3 mistral phi3; do
        section "check-tiny-$arch" 120 tp-check "tests/data/tiny-$arch" 2 8 64
      done
      # One KV head on two GPUs: each rank keeps a replica of it.
      python3 scripts/gpu/one_kv_head.py tests/data/tiny-llama "$out/tiny-llama-one-kv-head" > /dev/null &&
        section check-tiny-llama-one-kv-head 120 tp-check "$out/tiny-llama-one-kv-head" 2 8 64
      section check-llama-3-8b 300 tp-check "$bin/configs/llama-3-8b.json" 2 8 64
      TANDEM_TP_ALL_REDUCE=nccl section check-llama-3-8b-nccl 300 tp-check "$bin/configs/llama-3-8b.json" 2 8 64
      # Four GPUs when the host has them: two ranks a KV head (tiny models), four (one KV head),
      # the two-shot all-reduce.
      if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 4 ]; then
        for m in tests/data/tiny-llama tests/data/tiny-qwen3 "$out/tiny-llama-one-kv-head" "$bin/configs/llama-3-8b.json"; do
          section "check-tp4-$(basename "$m" .json)" 300 tp-check "$m" 4 8 64
        done
      fi
      ;;
    bench)
      section decode-llama-3-70b 540 bench-decode "$bin/configs/llama-3-70b.json" 1,64,256 1024 2
      TANDEM_TP_ALL_REDUCE=peer-apart section decode-llama-3-70b-norm-apart 540 bench-decode "$bin/configs/llama-3-70b.json" 1,64,256 1024 2
      TANDEM_TP_ALL_REDUCE=nccl section decode-llama-3-70b-nccl 540 bench-decode "$bin/configs/llama-3-70b.json" 1,64,256 1024 2
      section prefill-llama-3-70b 300 bench-prefill "$bin/configs/llama-3-70b.json" 4 2048 2
      ;;
    disagg)
      OUT="${OUT:-.gpu/out}" bash scripts/gpu/disagg.sh "" .gpu/tandem/tandem tp 2>&1 | tee "$out/disagg-tp.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
      ;;
    *) echo "unknown section $s"; fail=1 ;;
  esac
done
# Every log in one archive (a device run returns few files).
tar czf "${OUT:-.gpu/out}/tp-logs.tgz" -C "${OUT:-.gpu/out}" tp $(cd "${OUT:-.gpu/out}" && ls -d disagg 2>/dev/null)
echo "tp.sh: $([ $fail = 0 ] && echo 'all sections passed' || echo 'FAILED')"
exit "$fail"
