//! The CUDA kernels compiled by NVRTC for real architectures, with no GPU: every variant
//! (kernel x f16/bf16 x head dim) to CUBIN for sm_80 and sm_90 (machine code, so ptxas runs:
//! PTX-only targets would check nothing), failing on any compile error or register spill.
//!
//! NVRTC comes from `FLASH_ATTN_NVRTC_DIR`, or from .tools/cuda-13.0/lib, where
//! `bash scripts/ensure-cuda.sh` (part of the README's test command) unpacks the pinned wheel.
#![cfg(feature = "cuda")]

mod common;

use common::nvrtc::nvrtc_dir;
use flash_attn_wgpu::cuda::kernels::{CudaKernel, CudaKey};
use flash_attn_wgpu::cuda::nvrtc::{Nvrtc, NVRTC_DIR_ENV};
use flash_attn_wgpu::{DType, Error};

fn nvrtc() -> Nvrtc {
    let dir = nvrtc_dir();
    Nvrtc::load_from(Some(&dir)).unwrap_or_else(|e| {
        panic!("{e}\n(run `bash scripts/ensure-cuda.sh` first, or set {NVRTC_DIR_ENV})")
    })
}

/// Every key for `arch` to CUBIN, without a spill; one test per arch, so the two run side by
/// side (a few minutes of ptxas each). The CI tier (tests/common/tier.rs) compiles each key
/// for one arch, in turns: every key once; the full tier every key for both.
fn every_kernel_compiles_without_spills_for(arch: u32) {
    let nvrtc = nvrtc();
    eprintln!("NVRTC {:?}", nvrtc.version());
    let mut report = Vec::new();
    let turn = usize::from(arch == 90);
    let keys = CudaKey::all_for_arch(arch);
    let total = keys.len();
    let keys: Vec<CudaKey> = keys
        .into_iter()
        .enumerate()
        .filter(|(i, _)| common::tier::full() || i % 2 == turn)
        .map(|(_, k)| k)
        .collect();
    eprintln!("sm_{arch}: {} of {total} keys", keys.len());
    for key in keys {
        let c = nvrtc
            .compile(&key)
            .unwrap_or_else(|e| panic!("{}: {e}", key.label()));
        // CUBIN is an ELF file
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}", key.label());
        assert!(
            c.log.contains("bytes spill stores"),
            "{}: {}",
            key.label(),
            c.log
        );
        assert_eq!(c.spill_bytes, 0, "{} spills:\n{}", key.label(), c.log);
        let regs = c.registers.expect("ptxas reports registers");
        assert!(regs <= 255, "{}", key.label());
        report.push(format!("{}: {regs} registers", key.label()));
    }
    eprintln!("{}", report.join("\n"));
    // each key compiles once per process
    let key = CudaKey::new(CudaKernel::Forward, DType::F16, 64, arch).unwrap();
    let a = nvrtc.compile(&key).unwrap();
    let b = nvrtc.compile(&key).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
}

#[test]
fn every_cuda_kernel_compiles_for_sm80_without_spills() {
    every_kernel_compiles_without_spills_for(80);
}

#[test]
fn every_cuda_kernel_compiles_for_sm90_without_spills() {
    every_kernel_compiles_without_spills_for(90);
}

#[test]
fn user_score_modifiers_compile_into_every_kernel() {
    // the tests' two modifiers (tests/common/score_mods.rs) in each kernel, with every other
    // modifier on (the score chain's whole CUDA), one on each architecture: in the CI tier
    // each kernel once, the two in turns (tier::pairs); in the full tier each with both
    use flash_attn_wgpu::unstable::kernels::flags;
    let nvrtc = nvrtc();
    let kernels = [
        (CudaKernel::Forward, DType::F16, 64),
        (CudaKernel::Backward, DType::BF16, 64),
        (CudaKernel::SimtForward, DType::F32, 40),
        (CudaKernel::SimtBackward, DType::F32, 40),
        (CudaKernel::Decode, DType::F16, 128),
    ];
    let mods: [(u32, fn() -> flash_attn_wgpu::ScoreMod); 2] = [
        (80, common::score_mods::softcap),
        (90, common::score_mods::rational),
    ];
    for ((kernel, dtype, head_dim), (arch, m)) in common::tier::pairs(&kernels, &mods, |_, _| true)
    {
        let m = m();
        let mut key = CudaKey::new(kernel, dtype, head_dim, arch).unwrap();
        key.flags = flags::every() & !(flags::CAUSAL | flags::WINDOW | flags::VIEWS);
        if kernel == CudaKernel::Decode {
            key.flags &= !flags::VARLEN;
        }
        key.score_mod = m.cuda_source();
        let c = nvrtc
            .compile(&key)
            .unwrap_or_else(|e| panic!("{}: {e}", key.label()));
        // user code may cost registers (the decode kernel with every modifier and the
        // rational one spills 12 bytes on sm_90): compiled is the check, spills reported
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}", key.label());
        eprintln!(
            "{}: {:?} registers, {} bytes spilled",
            key.label(),
            c.registers,
            c.spill_bytes
        );
    }
    // code that does not compile comes back with NVRTC's log
    let mut key = CudaKey::new(CudaKernel::SimtForward, DType::F32, 40, 80).unwrap();
    key.flags = flags::SCORE_MOD;
    key.score_mod = Some("__device__ float score_mod(float s) { return s + ; }");
    match nvrtc.compile(&key) {
        Err(Error::CudaCompile { log, .. }) => assert!(log.contains("error"), "{log}"),
        other => panic!(
            "expected a compile error, got {:?}",
            other.map(|c| c.log.clone())
        ),
    }
}

#[test]
fn user_masks_compile_into_every_kernel() {
    // the tests' two CUDA masks (tests/common/score_mods.rs) in each kernel, with a block mask
    // (its full blocks read) and a score modifier beside them, one on each architecture: in
    // the CI tier each kernel once, the two in turns (tier::pairs); in the full tier each with
    // both
    use flash_attn_wgpu::unstable::kernels::flags;
    let nvrtc = nvrtc();
    let score = common::score_mods::softcap();
    let kernels = [
        (CudaKernel::Forward, DType::BF16, 64),
        (CudaKernel::Backward, DType::F16, 64),
        (CudaKernel::SimtForward, DType::F32, 40),
        (CudaKernel::SimtBackward, DType::F32, 40),
        (CudaKernel::Decode, DType::F16, 128),
    ];
    let mods: [(u32, fn() -> flash_attn_wgpu::MaskMod); 2] = [
        (80, || common::score_mods::prefix_lm(9)),
        (90, common::score_mods::dilated),
    ];
    for ((kernel, dtype, head_dim), (arch, m)) in common::tier::pairs(&kernels, &mods, |_, _| true)
    {
        let m = m();
        for bits in [
            flags::MASK_MOD,
            flags::MASK_MOD | flags::BLOCKS | flags::SCORE_MOD,
        ] {
            let mut key = CudaKey::new(kernel, dtype, head_dim, arch).unwrap();
            key.flags = bits;
            key.mask_mod = m.cuda_source();
            key.score_mod = score.cuda_source();
            let c = nvrtc
                .compile(&key)
                .unwrap_or_else(|e| panic!("{}: {e}", key.label()));
            assert_eq!(&c.cubin[..4], b"\x7fELF", "{}", key.label());
            assert_eq!(c.spill_bytes, 0, "{}", key.label());
        }
    }
}

#[test]
fn captured_tensors_reach_the_cuda_user_code() {
    // a score modifier reading a table and a mask reading document ids, both captured, in
    // each kernel family: their accessors come before the user code
    use flash_attn_wgpu::unstable::kernels::flags;
    let nvrtc = nvrtc();
    let mut cfg = flash_attn_wgpu::AttentionConfig::new(1, 40, 40, 2, 2, 64);
    cfg.score_mod = Some(common::score_mods::t5(2, vec![0.5; 32]));
    cfg.mask_mod = Some(common::score_mods::documents(vec![0.0; 40]));
    for (kernel, dtype, head_dim, arch) in [
        (CudaKernel::Forward, DType::F16, 64, 90),
        (CudaKernel::Backward, DType::BF16, 64, 80),
        (CudaKernel::SimtForward, DType::F32, 40, 80),
        (CudaKernel::Decode, DType::F16, 64, 90),
    ] {
        let mut key = CudaKey::new(kernel, dtype, head_dim, arch).unwrap();
        key.flags = flags::SCORE_MOD | flags::MASK_MOD;
        key.set_user_code(&cfg).unwrap();
        let captured = key.captured.expect("accessors for the captured tensors");
        assert!(
            captured.contains("float t5_bias(unsigned int i)"),
            "{captured}"
        );
        assert!(
            captured.contains("flash_captured + 32u + min(i, 39u)"),
            "{captured}"
        );
        let c = nvrtc
            .compile(&key)
            .unwrap_or_else(|e| panic!("{}: {e}", key.label()));
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{}", key.label());
    }
    // WGSL alone: its translation compiles; WGSL the translation does not take is refused,
    // naming the modifier and why
    cfg.mask_mod = Some(
        flash_attn_wgpu::MaskMod::wgsl(
            "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return (i32(i) - i32(j)) % 3 == 0; }",
        )
        .unwrap(),
    );
    let mut key = CudaKey::new(CudaKernel::SimtForward, DType::F32, 40, 80).unwrap();
    key.set_user_code(&cfg).unwrap();
    let c = nvrtc
        .compile(&key)
        .unwrap_or_else(|e| panic!("{}: {e}", key.label()));
    assert_eq!(&c.cubin[..4], b"\x7fELF", "{}", key.label());
    cfg.mask_mod = Some(
        flash_attn_wgpu::MaskMod::wgsl(
            "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {\n    return all(vec2<bool>(i >= j, h < 4u));\n}",
        )
        .unwrap(),
    );
    match key.set_user_code(&cfg) {
        Err(Error::Unsupported {
            feature, reason, ..
        }) => assert!(
            feature.contains("mask_mod") && reason.contains("line 2"),
            "{feature}: {reason}"
        ),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn a_compile_error_is_a_typed_error_with_the_log() {
    let nvrtc = nvrtc();
    // sm_75 (Turing) has no bf16 mma or cp.async: the kernel cannot compile for it.
    // CudaKey::new refuses such an arch itself, so the key is built by hand to reach NVRTC.
    let key = CudaKey {
        kernel: CudaKernel::Forward,
        dtype: DType::BF16,
        head_dim: 64,
        arch: 75,
        flags: 0,
        score_mod: None,
        mask_mod: None,
        captured: None,
        decode_rows: 0,
    };
    match nvrtc.compile(&key) {
        Err(Error::CudaCompile { kernel, log }) => {
            assert!(kernel.contains("sm_75"), "{kernel}");
            assert!(!log.is_empty());
        }
        other => panic!(
            "expected a compile error, got {:?}",
            other.map(|c| c.log.clone())
        ),
    }
}
