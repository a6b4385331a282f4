//! Guard on the CPU kernels' code generation, independent of timing: every SIMD intrinsic the
//! engine uses must be inlined into a function compiled with its target features. An intrinsic
//! left out of line (a helper or closure compiled without the features, as once happened to the
//! AVX2 tile kernel) costs a call per instruction and made the AVX2 path 15x slower.
//!
//! Only the engine's functions are checked: the release binary also holds 8 out-of-line
//! `_mm256_loadu_si256` calls, from aho-corasick 1.1.5's Teddy searcher set-up (reached through
//! `tokenizers` → `regex`), which are third-party and run when a pattern is built, not per token
//! (upstream: BurntSushi/aho-corasick#140, open; its vector helpers carry `#[inline(always)]`
//! without `#[target_feature]`, and the mask set-up maps arrays through a closure).
//!
//! The check disassembles this test executable (the engine is built at opt-level 3 in every
//! profile) and fails when a function of the engine calls into `core::core_arch`. It needs
//! `objdump` from binutils.

#![cfg(target_arch = "x86_64")]

use std::process::Command;
use std::sync::Arc;

use tandem_engine::backend::cpu::linear::{Linear, QuantLinear};
use tandem_engine::backend::cpu::quant::{QKernel, QMatrix};
use tandem_engine::backend::cpu::{ops, CpuBackend};
use tandem_engine::backend::ModelBackend;
use tandem_engine::model_files::dtype::GgmlType;

/// Makes sure every kernel is linked into this executable: the matmul dispatch (all ISA paths),
/// the element-wise ops, and a backend forward pass (attention, quantisation, norms).
fn link_every_kernel() {
    let (n, k) = (8, 64);
    let data = vec![0u8; GgmlType::Q4_1.bytes_for(n * k)];
    let w = Arc::new(QMatrix::from_gguf(GgmlType::Q4_1, &data, n, k).expect("repack"));
    let x = vec![0.5f32; 4 * k];
    let mut out = vec![0f32; 4 * n];
    for kernel in QKernel::available() {
        QuantLinear::new(w.clone(), kernel).forward(&x, 4, &mut out);
    }
    let mut g = vec![1f32; 16];
    ops::silu_mul(&mut g, &[1f32; 16]);
    ops::gelu_tanh_mul(&mut g, &[1f32; 16]);
    std::hint::black_box(<CpuBackend as ModelBackend>::forward as fn(&mut CpuBackend, &_) -> _);
    std::hint::black_box(&out);
}

/// `(caller, callee)` for every call from an engine function into a `core::core_arch` item.
fn out_of_line_intrinsics(disassembly: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut current = String::new();
    for line in disassembly.lines() {
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")).map(|(_, n)| n)
        {
            current = name.to_string();
            continue;
        }
        if !current.contains("tandem_engine") {
            continue;
        }
        let Some(target) = line.split_once("call").map(|(_, t)| t) else { continue };
        if let Some(callee) = target.split_once('<').map(|(_, c)| c.trim_end_matches('>')) {
            if callee.contains("core_arch") {
                found.push((current.clone(), callee.to_string()));
            }
        }
    }
    found
}

/// This test executable, disassembled.
fn disassembly() -> (std::path::PathBuf, String) {
    link_every_kernel();
    let exe = std::env::current_exe().expect("test executable");
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-C"])
        .arg(&exe)
        .output()
        .expect("objdump (binutils) is needed for this check: apt-get install binutils");
    assert!(out.status.success(), "objdump failed: {}", String::from_utf8_lossy(&out.stderr));
    (exe, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The instructions of every function whose name contains `name`.
fn instructions_of<'a>(disassembly: &'a str, name: &str) -> Vec<&'a str> {
    let mut inside = false;
    let mut found = Vec::new();
    for line in disassembly.lines() {
        if line.ends_with(">:") {
            inside = line.contains(name);
        } else if inside {
            found.push(line);
        }
    }
    found
}

/// The AVX-512 batch kernel's design rests on one `vpdpwssd` per eighth of a pair, row and
/// four tokens (`quant_x86/wide512.rs`): the intrinsic alone is compiled as `vpmaddwd` +
/// `vpaddd` without a tuned target CPU, so the kernel writes the instruction out. This checks
/// that the compiled kernel accumulates on 512-bit `vpdpwssd`.
#[test]
fn the_avx512_batch_kernel_accumulates_with_vpdpwssd() {
    let (_, text) = disassembly();
    // Seven per tile variant and row: the first eighth of a pair is a `vpmaddwd`.
    let dots = vpdpwssd_in(&text, "quant_x86::wide512::rows", "%zmm");
    assert!(dots >= 7, "{dots} vpdpwssd on zmm in the AVX-512 batch kernel");
}

/// How many `vpdpwssd` on `register` class the functions named `name` hold (which must exist).
fn vpdpwssd_in(text: &str, name: &str, register: &str) -> usize {
    let body = instructions_of(text, name);
    assert!(!body.is_empty(), "{name} is not in the executable");
    body.iter().filter(|l| l.contains("vpdpwssd") && l.contains(register)).count()
}

/// The same on 256 bits for the AVX-VNNI batch kernel (`quant_x86/wide256.rs`), whose
/// `vpdpwssd` is AVX-VNNI's VEX encoding.
#[test]
fn the_avx_vnni_batch_kernel_accumulates_with_vpdpwssd() {
    let (_, text) = disassembly();
    // At least one per half of a quad and row of the widest tile (three rows), in the loop over
    // a pair's eighths.
    let dots = vpdpwssd_in(&text, "quant_x86::wide256::vnni::rows", "%ymm");
    assert!(dots >= 6, "{dots} vpdpwssd on ymm in the AVX-VNNI batch kernel");
    let plain = vpdpwssd_in(&text, "quant_x86::wide256::plain::rows", "");
    assert_eq!(plain, 0, "VNNI in the plain AVX2 kernel");
}

#[test]
fn no_intrinsic_is_called_out_of_line() {
    let (exe, text) = disassembly();
    // The check must see the kernels, or it proves nothing.
    assert!(
        text.contains("tandem_engine::backend::cpu::quant_x86"),
        "no quant_x86 kernel in {}",
        exe.display()
    );
    let bad = out_of_line_intrinsics(&text);
    let mut listed: Vec<String> =
        bad.iter().map(|(f, c)| format!("  {f}\n    calls {c}")).collect();
    listed.sort();
    listed.dedup();
    assert!(
        bad.is_empty(),
        "{} calls to out-of-line SIMD intrinsics from engine code:\n{}",
        bad.len(),
        listed.join("\n")
    );
}

#[test]
fn the_scan_finds_an_out_of_line_call() {
    // The parser itself, on a fragment in objdump's format.
    let sample = "0000000000001000 <tandem_engine::backend::cpu::quant_x86::tile::{{closure}}>:\n    1000:\tcall   2000 <core::core_arch::x86::avx2::_mm256_madd_epi16>\n0000000000003000 <other::f>:\n    3000:\tcall   2000 <core::core_arch::x86::avx2::_mm256_madd_epi16>\n";
    let found = out_of_line_intrinsics(sample);
    assert_eq!(found.len(), 1);
    assert!(found[0].0.contains("quant_x86::tile"));
}
