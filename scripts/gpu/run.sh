#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks (tandem-gpu), every figure printed with the device name:
# each kernel against the CPU exact path (bf16 and f16), the default model end to end against the
# CPU exact path, the tiny random-weight model of each architecture end to end, the decode step against the HBM roofline and prefill against the cuBLAS GEMM
# peak (Llama-3-8B shape, random weights), each limit measured in the same run; then the whole
# engine on nano-vllm's benchmark workload (Qwen3-0.6B shape, random weights, temperature 0.6)
# beside Hugging Face transformers on the same requests when torch and transformers are installed.
#
#   scripts/gpu/run.sh build          build tandem-gpu and tandem (no CUDA needed to build) and stage
#                                     them with the shape configs in .gpu/bin/ and .gpu/tandem/
#                                     (copy those folders to a GPU host)
#   scripts/gpu/run.sh run [MODEL]    on a host with an NVIDIA GPU (driver and CUDA 13 runtime
#                                     libraries: libcuda, libnvrtc, libcublas): run every section
#                                     from .gpu/bin/; MODEL defaults to the embedded default model
#   scripts/gpu/run.sh engine         the nano-vllm workload section alone
#   scripts/gpu/run.sh all [MODEL]    both, on a GPU host with Rust
#
# Logs go to $OUT (default .gpu/out), one file per section.
set -uo pipefail
cd "$(dirname "$0")/../.."
cmd="${1:-all}"
bin=.gpu/bin
out="${OUT:-.gpu/out}"

build() {
  cargo build --release -p tandem-cuda --bin tandem-gpu >&2 || exit 1
  mkdir -p "$bin"
  strip -o "$bin/tandem-gpu" target/release/tandem-gpu 2>/dev/null || cp target/release/tandem-gpu "$bin/tandem-gpu"
  cp -r cuda/configs "$bin/"
  echo "staged $(du -sh "$bin" | cut -f1) in $bin" >&2
  cargo build --release -p tandem-cli --bin tandem >&2 || exit 1
  mkdir -p .gpu/tandem
  strip -o .gpu/tandem/tandem target/release/tandem 2>/dev/null || cp target/release/tandem .gpu/tandem/tandem
  echo "staged $(du -sh .gpu/tandem | cut -f1) in .gpu/tandem" >&2
}

# nano-vllm's bench.py workload through the whole engine (continuous batching, CUDA graphs,
# sampling on the GPU), and transformers on the same requests for the ratio.
engine() {
  mkdir -p "$out"
  local t=.gpu/tandem/tandem w="$out/nano-vllm-workload.json"
  python3 scripts/gpu/hf_baseline.py --dump-workload "$w" || return 1
  echo "== engine-nano-vllm: tandem bench engine (Qwen3-0.6B shape, dummy weights)"
  timeout -k 5 600 "$t" bench engine --device cuda --load-format dummy --model "$bin/configs/qwen3-0.6b.json" \
    --workload-file "$w" --temperature 0.6 --max-num-seqs 256 --max-num-batched-tokens 16384 --json 2>&1 | tee "$out/engine-nano-vllm.log"
  if python3 -c "import torch, transformers" 2>/dev/null; then
    echo "== hf-transformers-nano-vllm: scripts/gpu/hf_baseline.py"
    timeout -k 5 900 python3 scripts/gpu/hf_baseline.py --config "$bin/configs/qwen3-0.6b.json" 2>&1 | tail -1 | tee "$out/hf-transformers-nano-vllm.log"
  else
    echo "torch/transformers not installed: transformers baseline skipped"
  fi
}

run() {
  local model="${1:-${TANDEM_MODEL:-$HOME/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf}}"
  mkdir -p "$out"
  local g="$bin/tandem-gpu" fail=0
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/smi.log"
  section() { local name="$1"; shift; echo "== $name: tandem-gpu $*"; timeout -k 5 300 "$g" "$@" 2>&1 | tee "$out/$name.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1; }
  section info info
  section check-bf16 check bf16
  section check-f16 check f16
  if [ -f "$model" ]; then
    section e2e-f16 e2e "$model" f16
    section e2e-bf16 e2e "$model" bf16
  else
    echo "no model at $model: end-to-end section skipped (give MODEL)"; fail=1
  fi
  # Each architecture the CUDA backend runs, on the committed random-weight models (Qwen2's
  # q|k|v bias, Phi-3's fused tensors, Mistral's sliding window of 16 positions).
  for arch in llama qwen2 qwen3 mistral phi3; do
    section "e2e-tiny-$arch" e2e "tests/data/tiny-$arch" f16
  done
  # The tiny models' 16-wide heads take the CUDA-core kernels only; with torch, random Llamas
  # with 64- and 128-wide heads check the tensor-core ones (decode tiles, prefill kernel), in
  # f16: in bf16 their peaked random logits move by more than the default model's tolerances
  # on short prompts (0.12-0.14 nats against 0.1 at width 128, H200, 2026-11-27).
  for hd in 64 128; do
    local shape_hd="${TMPDIR:-/tmp}/tandem-llama-hd$hd"
    [ -d "$shape_hd" ] || python3 scripts/gpu/make_llama_shape.py "$shape_hd" "$hd" >/dev/null 2>&1 || rm -rf "$shape_hd"
    [ -d "$shape_hd" ] && section "e2e-llama-hd$hd" e2e "$shape_hd" f16
  done
  # Sliding-window models through the engine, local layers' pages given back past the window
  # against keeping every page; with torch, also a random Gemma 3 at the 270M widths (window
  # 512; the real file cannot travel to a GPU host).
  local shape="${TMPDIR:-/tmp}/tandem-gemma3-270m-shape"
  [ -d "$shape" ] || python3 scripts/gpu/make_gemma3_shape.py "$shape" >/dev/null 2>&1 || rm -rf "$shape"
  section windows windows tests/data/tiny-gemma3 tests/data/tiny-mistral $([ -d "$shape" ] && echo "$shape")
  section decode bench-decode "$bin/configs/llama-3-8b.json" 1,16,64,256 1024
  section prefill bench-prefill "$bin/configs/llama-3-8b.json" 4 2048
  # The prefill kernel's previous shape (8 warps, one CTA per SM, Q and P split) for comparison.
  TANDEM_PF_WARPS=8 TANDEM_CUDA_DEFINES="PF_MIN_BLOCKS=1 TANDEM_PF_SPLIT_Q TANDEM_PF_SPLIT_P" \
    section prefill-8-warps-split bench-prefill "$bin/configs/llama-3-8b.json" 4 2048
  section decode-qwen3 bench-decode "$bin/configs/qwen3-0.6b.json" 1,64,256 1024
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    # KV pages GPU 0 -> GPU 1 over NCCL against raw NCCL (NVLS multicast stays off).
    NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" section pages bench-pages "$bin/configs/llama-3-8b.json" 1,16,256,4096 64 96 3
  fi
  [ -x .gpu/tandem/tandem ] && { engine || fail=1; }
  [ "$fail" -eq 0 ] && echo "all sections passed" || echo "some section failed"
  return "$fail"
}

case "$cmd" in
  build) build ;;
  run) shift; run "$@" ;;
  engine) engine ;;
  all) shift; build && run "$@" ;;
  *) echo "usage: $0 build | run [MODEL] | engine | all [MODEL]" >&2; exit 2 ;;
esac
