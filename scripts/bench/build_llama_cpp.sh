#!/usr/bin/env bash
# Builds llama.cpp (the peer) from the PyPI source package of llama-cpp-python, with this CPU's
# features on and AMX off (the CPU advertises AMX; the hypervisor faults on it). The build is
# cached in $TANDEM_CACHE_DIR/llama.cpp (default ~/.cache/tandem/llama.cpp); prints the bin dir.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/llama.cpp"
BIN="$CACHE/build-$VERSION/bin"
if [[ -x "$BIN/llama-bench" && -x "$BIN/llama-batched-bench" && -x "$BIN/llama-server" ]]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$CACHE"
VENV="$CACHE/venv"
[[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install -q cmake ninja >&2
SRC="$CACHE/src-$VERSION"
if [[ ! -d "$SRC" ]]; then
  tmp="$(mktemp -d)"
  "$VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==$VERSION" >&2
  mkdir -p "$SRC"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$SRC" --strip-components=1
  rm -rf "$tmp"
fi
LLAMA="$SRC/vendor/llama.cpp"
PATH="$VENV/bin:$PATH" cmake -S "$LLAMA" -B "$CACHE/build-$VERSION" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >&2
PATH="$VENV/bin:$PATH" cmake --build "$CACHE/build-$VERSION" --target llama-bench llama-batched-bench llama-server -j "$(nproc)" >&2
echo "$BIN"
