//! The kernel source compiles with NVRTC for Ampere (sm_80) and Hopper (sm_90, and sm_90a as the
//! backend compiles it for an H100 or H200), in both 16-bit
//! types, on a machine without a GPU: a CUDA error shows here, not on a device run. Needs
//! libnvrtc on the library path (the PyPI wheel `nvidia-cuda-nvrtc`, which `.ci/run` fetches);
//! without it the test says so and passes, as every GPU check does on a machine without CUDA.

use tandem_cuda::device::{
    kernel_options, nvrtc_arch, nvrtc_cubin, rope_config, rope_tokens, Dtype, KERNEL_SOURCE,
    PDL_PLAIN, PDL_PLAIN_AFTER_GEMM, PDL_PLAIN_WAITING, ROPE_MANY_TOKENS,
};

#[test]
fn kernels_compile_for_ampere_and_hopper_in_both_16_bit_types() {
    // SAFETY: a dlopen probe, no call into the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found (pip download nvidia-cuda-nvrtc; see .ci/run)");
        return;
    }
    for arch in ["sm_80", "sm_90", "sm_90a"] {
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
        // The stream GEMMs request their weights (which no kernel writes) before they wait,
        // the fused decode kernels their first pages (checked below).
        let weights_first = body.starts_with("GEMM_STREAM_BODY(");
        let pages_first = body.starts_with("DEC_ROPE_ENTRY();");
        assert!(
            body.starts_with("KERNEL_ENTRY();") || weights_first || pages_first,
            "kernel `{}` does not begin with KERNEL_ENTRY()",
            decl[..name_end].trim()
        );
        kernels += 1;
        rest = &decl[open..];
    }
    // The source's kernels (a count that moves when one is added, so this test keeps reading
    // all of them).
    assert!(kernels >= 30, "found only {kernels} kernels");
}

/// The source of the function that starts at `start` (up to its closing brace at column 0), and
/// its part before `wait`.
fn split_at_wait(start: &str, wait: &str) -> (&'static str, &'static str) {
    let at = KERNEL_SOURCE.find(start).unwrap_or_else(|| panic!("no `{start}`"));
    let body = &KERNEL_SOURCE[at..];
    let body = &body[..body.find("\n}\n").expect("the function's end")];
    let w = body.find(wait).unwrap_or_else(|| panic!("no `{wait}` in `{start}`"));
    (body, &body[..w])
}

/// The stream GEMM kernels touch nothing but their weights before they wait: up to its
/// `griddepcontrol.wait`, `gemm_stream_impl` loads only W (`gs_load_w`), then A and the output.
#[test]
fn stream_gemms_wait_before_reading_what_other_kernels_write() {
    let (body, before) = split_at_wait("gemm_stream_impl(const h16*", "griddepcontrol.wait");
    assert!(before.contains("gs_load_w("), "the weights are requested before the wait");
    for touch in ["gs_load_a", "cs[", "*y", "reinterpret_cast", "ld_cluster4"] {
        assert!(!before.contains(touch), "`{touch}` before the wait");
    }
    assert!(body[before.len()..].contains("gs_load_a<MT>("));
    // Every kernel defined through the macro has the body that waits.
    let kernels = KERNEL_SOURCE.matches("\nGEMM_STREAM_KERNEL(").count();
    assert_eq!(kernels, 4);
}

/// The fused decode kernels touch only the KV pages of earlier steps before they wait: in
/// `attention_dec_impl`, the wait (for the fused variant) comes after the first page copies and
/// before the prologue that reads the q|k|v rows and stores the new positions, and both kernels
/// begin with `DEC_ROPE_ENTRY`, which waits at entry unless those early copies are compiled in.
#[test]
fn fused_decode_kernels_copy_only_old_pages_before_they_wait() {
    let (body, before) = split_at_wait("void attention_dec_impl(", "if (ROPE) KERNEL_ENTRY();");
    assert!(before.contains("issue(j, j)"), "the first pages are copied before the wait");
    assert!(before.contains("if (!early(j))"), "pages with new positions are deferred");
    for touch in
        ["dec_rope_prologue(", "rope_head<", "DEC_LOAD_Q(qst", "out[", "part_acc[", "merge_splits("]
    {
        assert!(!before.contains(touch), "`{touch}` before the wait");
    }
    // Queries from `q` (a kernel's output) only in the unfused variant, which waits at entry.
    assert_eq!(before.matches("DEC_LOAD_Q(").count(), 2, "the macro and the unfused load");
    assert!(before.contains("if (!ROPE) {\n    DEC_LOAD_Q(q +"), "the unfused load only");
    assert!(body[before.len()..].contains("dec_rope_prologue<"), "the prologue after the wait");
    let entry = KERNEL_SOURCE.find("#define DEC_ROPE_ENTRY() KERNEL_ENTRY()").expect("the entry");
    assert!(KERNEL_SOURCE[..entry].contains("#ifdef TANDEM_DEC_EARLY_COPIES"));
    assert_eq!(KERNEL_SOURCE.matches("DEC_ROPE_ENTRY();").count(), 2, "both fused kernels");
    // The early copies are what the backend compiles by default.
    let opts = kernel_options("sm_90a", Dtype::Bf16);
    assert!(opts.iter().any(|o| o == "-DTANDEM_DEC_EARLY_COPIES"), "{opts:?}");
}

/// The kernels launched plainly are named as the source names them (a renamed kernel would
/// otherwise fail `Gpu::open` on a GPU host only).
#[test]
fn kernels_launched_plainly_exist() {
    for name in PDL_PLAIN.into_iter().chain(PDL_PLAIN_AFTER_GEMM).chain(PDL_PLAIN_WAITING) {
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

/// The host launches `qkv_rope_store` with each warp taking one token, or for a prefill
/// `rope_tokens(hd)` of them on the `…xN` kernel, and sizes the grid for that many: a kernel
/// holding fewer (`TOKS` in its `ROPE_KERNEL` line) would leave tokens without q, k or v.
#[test]
fn rope_kernels_take_the_tokens_the_host_plans() {
    let lines: Vec<&str> =
        KERNEL_SOURCE.lines().filter(|l| l.trim_start().starts_with("ROPE_KERNEL(")).collect();
    assert_eq!(lines.len(), 5, "the qkv_rope_store variants: {lines:?}");
    let mut prefill_pairs = Vec::new();
    for l in lines {
        let args: Vec<&str> = l
            .trim_start()
            .trim_start_matches("ROPE_KERNEL(")
            .trim_end_matches(')')
            .split(',')
            .map(str::trim)
            .collect();
        let pairs: usize = match args[1] {
            "ROPE_PAIRS" => 16,
            p => p.parse().unwrap_or_else(|_| panic!("pairs of {l}")),
        };
        let toks: usize = args[2].parse().unwrap_or_else(|_| panic!("tokens of {l}"));
        match args[0].rsplit_once('x') {
            Some((_, n)) if n.parse::<usize>().is_ok() => {
                assert_eq!(toks, n.parse::<usize>().unwrap(), "{l}");
                assert_eq!(rope_tokens(64 * pairs), toks, "{l}: the host's tokens a warp");
                prefill_pairs.push(pairs);
            }
            _ => assert_eq!(toks, 1, "{l}: the one-token kernels"),
        }
    }
    // Every width the host gives more than one token a warp has its kernel.
    for hd in [32, 64, 96, 128, 256, 512, 1024] {
        if rope_tokens(hd) > 1 {
            assert!(prefill_pairs.contains(&hd.div_ceil(64)), "no prefill kernel for heads {hd}");
        }
    }
}

/// Decode steps keep one token a warp; passes of `ROPE_MANY_TOKENS` tokens or more take the
/// kernel's most, and the grid covers every token either way.
#[test]
fn rope_launches_cover_every_token() {
    for hd in [64, 128, 256, 512] {
        for tokens in [1, 255, ROPE_MANY_TOKENS - 1, ROPE_MANY_TOKENS, 8_208] {
            let (cfg, per_warp) = rope_config(tokens, 15, hd);
            let want = if tokens >= ROPE_MANY_TOKENS { rope_tokens(hd) } else { 1 };
            assert_eq!(per_warp as usize, want, "heads {hd} wide, {tokens} tokens");
            assert!(cfg.grid_dim.0 as usize * per_warp as usize >= tokens, "{tokens} tokens");
            assert!((cfg.grid_dim.0 as usize - 1) * (per_warp as usize) < tokens, "no idle row");
        }
    }
}

/// The decode kernels read each KV page once a step, so their page copies carry an L2
/// evict-first policy (one NVIDIA H200, `attention_dec128`, cuBLAS GEMMs, decode graphs, bf16
/// random weights, `tandem-gpu bench-decode cuda/configs/qwen3-0.6b.json 16,64,256 100-2048`:
/// the step at batch 256 9.48 → 9.31 ms; docs/gpu-runs/h200-2026-11-29-l2-hints/); the prefill
/// kernel, whose pages several tiles read, keeps plain copies. Read from the PTX NVRTC makes
/// for sm_90.
#[test]
fn decode_page_copies_are_marked_evict_first() {
    // SAFETY: a dlopen probe, no call into the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found (pip download nvidia-cuda-nvrtc; see .ci/run)");
        return;
    }
    let options = kernel_options("sm_90", Dtype::Bf16);
    let opts = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).expect("PTX").to_src();
    // A kernel's PTX: from its `.entry` to the next one.
    let body = |name: &str| {
        let at = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} in PTX"));
        let rest = &ptx[at + 1..];
        &rest[..rest.find(".entry").unwrap_or(rest.len())]
    };
    for name in ["attention_dec64", "attention_dec128", "attention_mma64", "attention_mma128"] {
        let b = body(name);
        let copies: Vec<&str> =
            b.lines().filter(|l| l.contains("cp.async.cg.shared.global")).collect();
        assert!(!copies.is_empty(), "{name}: no page copies");
        assert!(b.contains("createpolicy.fractional.L2::evict_first"), "{name}: no policy");
        for c in copies {
            assert!(c.contains("L2::cache_hint"), "{name}: a copy without the hint: {c}");
        }
    }
    for name in ["attention_prefill64", "attention_prefill128"] {
        assert!(!body(name).contains("evict_first"), "{name} marks its pages evict-first");
    }
}

/// On Hopper the backend compiles for sm_90a, and there the stream GEMMs multiply with the
/// warpgroup MMA reading both operands from shared memory (wgmma, no ldmatrix); for plain sm_90
/// (and with `TANDEM_GS_MMA_SYNC`) they keep mma.sync. Read from the PTX NVRTC makes.
#[test]
fn stream_gemms_use_the_warpgroup_mma_on_hopper() {
    // SAFETY: a dlopen probe, no call into the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found (pip download nvidia-cuda-nvrtc; see .ci/run)");
        return;
    }
    assert_eq!(nvrtc_arch(9, 0), "sm_90a");
    assert_eq!(nvrtc_arch(8, 9), "sm_89");
    let ptx = |arch: &str, extra: Option<&str>| {
        let mut options = kernel_options(arch, Dtype::Bf16);
        options.extend(extra.map(String::from));
        let opts = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
        cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).expect("PTX").to_src()
    };
    let body = |ptx: &str, name: &str| -> String {
        let at = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} in PTX"));
        let rest = &ptx[at + 1..];
        rest[..rest.find(".entry").unwrap_or(rest.len())].to_string()
    };
    let (hopper, plain, sync) =
        (ptx("sm_90a", None), ptx("sm_90", None), ptx("sm_90a", Some("-DTANDEM_GS_MMA_SYNC")));
    for rows in [8, 16, 32, 64] {
        let name = format!("gemm_stream{rows}");
        let b = body(&hopper, &name);
        let wgmma = b.lines().filter(|l| l.contains("wgmma.mma_async")).count();
        // Four k16 products a 64-wide stage; the loop may be unrolled into more.
        assert!(wgmma >= 4 && wgmma % 4 == 0, "{name}: {wgmma} wgmma on sm_90a");
        assert!(b.contains(&format!("m64n{rows}k16")), "{name}: not m64n{rows}k16");
        assert!(b.contains("fence.proxy.async"), "{name}: cp.async writes not fenced");
        assert!(!b.contains("ldmatrix"), "{name}: still loads fragments on sm_90a");
        for other in [body(&plain, &name), body(&sync, &name)] {
            assert!(!other.contains("wgmma"), "{name}: wgmma outside sm_90a's default");
            assert!(other.contains("mma.sync"), "{name}: no mma.sync");
        }
    }
}
