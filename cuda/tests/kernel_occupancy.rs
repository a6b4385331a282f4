//! What NVRTC makes of the fused decode kernels (`attention_dec_rope*`: q/k norm + RoPE + KV
//! store inside the small-tile decode kernel) fits as many CTAs on an SM as the kernel it
//! replaces (`attention_dec*`), read from the CUBIN for sm_90a (what the backend compiles on Hopper) in both 16-bit types: its registers
//! and static shared memory are the ELF's `.nv.info` and `.nv.shared.*` sections. A prologue
//! that pushed the registers past that (3 CTAs of 4 warps for 128-wide heads, 10 of 2 warps for
//! 64) would cost the decode steps the fusion gained (one NVIDIA H200, `attention_dec_rope128`
//! against `qkv_rope_store_p2` + `attention_dec128`, cuBLAS GEMMs, decode graphs, bf16 random
//! weights, `tandem-gpu bench-decode cuda/configs/qwen3-0.6b.json 1,16,64,256 100-2048`:
//! Qwen3-0.6B at batch 256 9.30 → 8.96 ms, docs/gpu-runs/h200-2026-12-01-fused-rope/). Needs libnvrtc, as
//! kernels_compile.rs does; without it the test says so and passes.

use std::collections::HashMap;

use tandem_cuda::device::{kernel_options, nvrtc_arch, nvrtc_cubin, Dtype, KERNEL_SOURCE};
use tandem_cuda::plan::{dec_smem_bytes, dec_warps};

/// Per kernel: registers a thread (EIATTR_REGCOUNT) and static shared memory, bytes.
fn kernel_resources(elf: &[u8]) -> HashMap<String, (u32, u64)> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let cstr = |o: usize| {
        let end = elf[o..].iter().position(|&b| b == 0).unwrap();
        String::from_utf8_lossy(&elf[o..o + end]).into_owned()
    };
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28) as usize, u16_at(0x3a) as usize, u16_at(0x3c) as usize, u16_at(0x3e));
    // (name, offset, size, link) of every section.
    let secs: Vec<(u32, usize, usize, u32)> = (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            (u32_at(h), u64_at(h + 0x18) as usize, u64_at(h + 0x20) as usize, u32_at(h + 0x28))
        })
        .collect();
    let shstr = secs[shstrndx as usize].1;
    let name = |s: &(u32, usize, usize, u32)| cstr(shstr + s.0 as usize);
    let symtab = secs.iter().find(|s| name(s) == ".symtab").expect("a symbol table");
    let strtab = secs[symtab.3 as usize].1;
    let syms: Vec<String> =
        (0..symtab.2 / 24).map(|i| cstr(strtab + u32_at(symtab.1 + i * 24) as usize)).collect();
    let mut out: HashMap<String, (u32, u64)> = HashMap::new();
    for s in &secs {
        let n = name(s);
        if n == ".nv.info" {
            // Attributes: format byte, attribute byte; format 4 carries a u16 length and that
            // many bytes (for REGCOUNT, 0x2f: the symbol's index and the count), others 2 bytes.
            let mut p = s.1;
            while p < s.1 + s.2 {
                let (fmt, attr) = (elf[p], elf[p + 1]);
                if fmt == 4 {
                    let len = u16_at(p + 2) as usize;
                    if attr == 0x2f && len == 8 {
                        let (sym, regs) = (u32_at(p + 4), u32_at(p + 8));
                        out.entry(syms[sym as usize].clone()).or_default().0 = regs;
                    }
                    p += 4 + len;
                } else {
                    p += 4;
                }
            }
        } else if let Some(k) = n.strip_prefix(".nv.shared.") {
            out.entry(k.to_string()).or_default().1 = s.2 as u64;
        }
    }
    out
}

/// CTAs of `threads` threads with `regs` registers each and `smem` bytes of shared memory an
/// sm_90 SM holds: 64K registers given out per warp in units of 256, 228 KiB of shared memory,
/// at most 64 warps and 32 CTAs (what the driver's occupancy calculator gave on an H200 for
/// these kernels, `tandem-gpu info`: 10 CTAs of `attention_dec64`, 3 of `attention_dec128`).
fn ctas_per_sm(regs: u32, threads: u32, smem: u64) -> u32 {
    let warps = threads.div_ceil(32);
    let per_warp = (regs * 32).div_ceil(256) * 256;
    let by_regs = (65_536 / per_warp) / warps;
    let by_smem = (228 * 1024 / smem) as u32;
    by_regs.min(by_smem).min(64 / warps).min(32)
}

#[test]
fn fused_decode_kernels_fit_the_ctas_of_the_kernels_they_replace() {
    // SAFETY: a dlopen probe, no call into the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found (pip download nvidia-cuda-nvrtc; see .ci/run)");
        return;
    }
    // The model's own figures: the decode kernel's 3 CTAs an SM, 2 with 176 registers.
    assert_eq!(ctas_per_sm(124, 128, 69_632 + 5_136), 3);
    assert_eq!(ctas_per_sm(176, 128, 69_632 + 5_136), 2);
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let cubin =
            nvrtc_cubin(KERNEL_SOURCE, &kernel_options(&nvrtc_arch(9, 0), dtype)).expect("CUBIN");
        let res = kernel_resources(&cubin);
        for hd in [64, 128] {
            let threads = 32 * dec_warps(hd) as u32;
            let fit = |k: &str| {
                let (regs, smem) = *res.get(k).unwrap_or_else(|| panic!("{k} in the CUBIN"));
                assert!(regs > 0, "{k}: no register count read");
                (regs, ctas_per_sm(regs, threads, smem + dec_smem_bytes(hd) as u64))
            };
            let (plain, fused) =
                (fit(&format!("attention_dec{hd}")), fit(&format!("attention_dec_rope{hd}")));
            eprintln!("{dtype:?} hd {hd}: attention_dec {plain:?}, attention_dec_rope {fused:?} (registers, CTAs/SM)");
            assert!(
                fused.1 >= plain.1,
                "{dtype:?}, heads {hd} wide: the fused kernel fits {} CTAs an SM against {}",
                fused.1,
                plain.1
            );
        }
    }
}
