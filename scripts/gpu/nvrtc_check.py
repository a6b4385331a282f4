#!/usr/bin/env python3
"""Compiles the CUDA backend's kernels (cuda/src/kernels/*.cu, concatenated as `device.rs`'s
KERNEL_SOURCE does) with NVRTC for a GPU architecture on a machine without a GPU,
and prints ptxas's report of each kernel's registers, spills and shared memory.

NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc` (no driver needed to compile; `.ci/run`
fetches 13.0.88, the GPU hosts' version, into $TMPDIR/tandem-nvrtc-13.0.88 for the
`kernels_compile` test):

    L=/tmp/tandem-nvrtc-13.0.88/nvidia/cu13/lib
    LD_LIBRARY_PATH=$L python3 scripts/gpu/nvrtc_check.py --lib $L/libnvrtc.so.13 [-D DEF ...] [--arch sm_90]

(its builtins library is found through LD_LIBRARY_PATH).

The options are `device.rs`'s `kernel_options` with its defaults.

Exit status 1 when the source does not compile.
"""
import argparse
import ctypes
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [f"cuda/src/kernels/{n}.cu" for n in
           ["common", "layers", "attention", "attention_mma", "attention_decode", "elementwise", "sampling", "collective", "gemv", "gemm_stream"]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of libnvrtc.so")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-D", action="append", default=[], help="extra define (as TANDEM_CUDA_DEFINES)")
    ap.add_argument("--f16", action="store_true", help="compile for f16 models (-DTANDEM_F16)")
    a = ap.parse_args()
    nv = ctypes.CDLL(a.lib)
    src = "".join((ROOT / s).read_text() for s in SOURCES).encode()
    prog = ctypes.c_void_p()
    if nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"tandem_kernels.cu", 0, None, None) != 0:
        print("nvrtcCreateProgram failed")
        return 1
    # The options device.rs passes (defaults of PF_WARPS, MMA_STAGES, DEC_WARPS64/128), plus ptxas's report.
    opts = [f"--gpu-architecture={a.arch}", "-default-device", "-DPF_WARPS=4", "-DMMA_STAGES=2",
            "-DDEC_WARPS64=2", "-DDEC_WARPS128=4", "--ptxas-options=--verbose"]
    opts += ["-DTANDEM_F16"] if a.f16 else []
    opts += [f"-D{d}" for d in a.D]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    # ptxas prints a function's name, then its registers and spills.
    name = None
    for line in text.splitlines():
        if "Compiling entry function" in line:
            name = line.split("'")[1]
        elif "Used" in line and name:
            print(f"{name}: {line.split('info    :')[-1].strip()}")
        elif "bytes spill" in line and name and not line.strip().endswith("0 bytes spill loads"):
            print(f"{name}: {line.split('info    :')[-1].strip()}")
        elif "error" in line.lower() or "warning" in line.lower():
            print(line)
    print(f"nvrtc {a.arch} {' '.join(opts[4:])}: {'ok' if rc == 0 else f'FAILED ({rc})'}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
