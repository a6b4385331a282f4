//! The kernel source compiles with NVRTC for Ampere (sm_80) and Hopper (sm_90), in both 16-bit
//! types, on a machine without a GPU: a CUDA error shows here, not on a device run. Needs
//! libnvrtc on the library path (the PyPI wheel `nvidia-cuda-nvrtc`, which `.ci/run` fetches);
//! without it the test says so and passes, as every GPU check does on a machine without CUDA.

use tandem_cuda::device::{
    kernel_options, nvrtc_cubin, Dtype, KERNEL_SOURCE, PDL_PLAIN, PDL_PLAIN_AFTER_GEMM,
};

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

/// Every kernel waits for the kernel before it first (`KERNEL_ENTRY`): `Gpu::launch` launches
/// kernels as programmatic dependents on sm_90, so one that touched memory before waiting would
/// race its predecessor (and break the chain for the kernels after it).
#[test]
fn every_kernel_begins_by_waiting_for_its_predecessor() {
    let mut kernels = 0;
    let mut rest = KERNEL_SOURCE;
    while let Some(at) = rest.find("__global__") {
        let decl = &rest[at..];
        let open = decl.find('{').expect("a kernel body");
        let name_end = decl[..open].find('(').expect("a parameter list");
        let body = decl[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
        assert!(
            body.starts_with("KERNEL_ENTRY();"),
            "kernel `{}` does not begin with KERNEL_ENTRY()",
            decl[..name_end].trim()
        );
        kernels += 1;
        rest = &decl[open..];
    }
    // The source's kernels (a count that moves when one is added, so this test keeps reading
    // all of them).
    assert!(kernels >= 29, "found only {kernels} kernels");
}

/// The kernels launched plainly are named as the source names them (a renamed kernel would
/// otherwise fail `Gpu::open` on a GPU host only).
#[test]
fn kernels_launched_plainly_exist() {
    for name in PDL_PLAIN.into_iter().chain(PDL_PLAIN_AFTER_GEMM) {
        let declared = KERNEL_SOURCE.match_indices(name).any(|(at, _)| {
            let before = KERNEL_SOURCE[..at].trim_end();
            let after = &KERNEL_SOURCE[at + name.len()..];
            // `void name(`, `__launch_bounds__(…) name(`, or a kernel-defining macro's
            // `NAME_KERNEL(name, …)`.
            let plain =
                after.starts_with('(') && (before.ends_with(')') || before.ends_with("void"));
            plain || before.ends_with("_KERNEL(") && after.starts_with(',')
        });
        assert!(declared, "no kernel `{name}` in the source");
    }
}
