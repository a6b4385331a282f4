//! The kernel source compiles with NVRTC for Ampere (sm_80) and Hopper (sm_90), in both 16-bit
//! types, on a machine without a GPU: a CUDA error shows here, not on a device run. Needs
//! libnvrtc on the library path (the PyPI wheel `nvidia-cuda-nvrtc`, which `.ci/run` fetches);
//! without it the test says so and passes, as every GPU check does on a machine without CUDA.

use tandem_cuda::device::{kernel_options, nvrtc_cubin, Dtype, KERNEL_SOURCE};

#[test]
fn kernels_compile_for_ampere_and_hopper_in_both_16_bit_types() {
    // SAFETY: a dlopen probe, no call into the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found (pip download nvidia-cuda-nvrtc; see .ci/run)");
        return;
    }
    for arch in ["sm_80", "sm_90"] {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let cubin = nvrtc_cubin(KERNEL_SOURCE, &kernel_options(arch, dtype))
                .unwrap_or_else(|e| panic!("{arch} {dtype:?}: {e}"));
            // An ELF image (the CUBIN), not an empty or PTX answer.
            assert_eq!(&cubin[..4], b"\x7fELF", "{arch} {dtype:?}");
        }
    }
}
