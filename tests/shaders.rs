//! Every generated shader variant is valid WGSL with the bindings the host declares, and the
//! host's `Params` mirrors the shader's. Runs without a GPU (naga only).

mod common;
use flash_attn_wgpu::dtype::ElemFormat;
use flash_attn_wgpu::unstable::kernels::enumerate::{devices, pipeline_keys};
use flash_attn_wgpu::unstable::kernels::{
    choose_tiles, flags, Access, DeviceCaps, Kernel, KernelKey, Params, Pass, Variant,
};

fn parse_and_validate(key: &KernelKey) -> naga::Module {
    let src = key.wgsl();
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)));
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)));
    module
}

#[test]
fn every_generated_variant_passes_naga_validation() {
    let keys = pipeline_keys(&devices());
    assert!(keys.len() > 500, "{} variants", keys.len());
    for key in &keys {
        parse_and_validate(key);
    }
}

/// A key of `kernel` at head_dim 64 whose modifier bits are all read at run time (`all`) or
/// all compiled false.
fn key_of(kernel: Kernel, elem: ElemFormat, all: bool) -> KernelKey {
    KernelKey {
        kernel,
        elem,
        head_dim: 64,
        tiles: choose_tiles(
            kernel,
            64,
            DeviceCaps {
                coop: if kernel.is_coop() { 16 } else { 0 },
                ..DeviceCaps::WEBGPU_DEFAULT
            },
        )
        .unwrap(),
        runtime: if all { kernel.reads_flags() } else { 0 },
        flags: 0,
        wide: if all { 2 } else { 0 },
        keeps_grads: all && kernel.keeps_grads(),
        // the quantizing append exists for a cache format only
        kv: (kernel == Kernel::KvQuantize).then_some(flash_attn_wgpu::CacheFormat::Q8_0),
        ..KernelKey::plain(kernel)
    }
}

#[test]
fn shader_bindings_match_the_host_layout() {
    for (kernel, elem, all) in Kernel::ALL
        .into_iter()
        .flat_map(|k| ElemFormat::ALL.map(|e| (k, e)))
        .flat_map(|(k, e)| [(k, e, false), (k, e, true)])
    {
        let key = key_of(kernel, elem, all);
        let module = parse_and_validate(&key);
        // past the storage ones: the extras' uniform binding, the pair data's (boolean mask
        // bits, bias entries, block table) read-only storage binding and the bias gradients'
        // scratch, where the pipeline has them
        let extra_slots =
            key.uses_extras() as usize + key.uses_pairs() as usize + key.keeps_grads as usize;
        let mut found = vec![None; kernel.bindings().len() + 1 + extra_slots];
        for (_, var) in module.global_variables.iter() {
            let Some(binding) = &var.binding else {
                continue;
            };
            assert_eq!(binding.group, 0, "{kernel:?}");
            let slot = binding.binding as usize;
            assert!(
                slot < found.len(),
                "{kernel:?}: shader binding {slot} unknown to the host"
            );
            found[slot] = Some((var.space, var.name.clone()));
        }
        assert!(
            matches!(found[0], Some((naga::AddressSpace::Uniform, _))),
            "{kernel:?} params"
        );
        for (i, binding) in kernel.bindings().iter().enumerate() {
            match &found[i + 1] {
                Some((naga::AddressSpace::Storage { access: a }, name)) => {
                    let writes = a.contains(naga::StorageAccess::STORE);
                    assert_eq!(
                        writes,
                        binding.access == Access::ReadWrite,
                        "{kernel:?} binding {}",
                        i + 1
                    );
                    assert_eq!(
                        name.as_deref(),
                        Some(binding.name),
                        "{kernel:?} binding {}",
                        i + 1
                    );
                }
                other => panic!("{kernel:?} binding {}: {other:?}", i + 1),
            }
        }
        if key.uses_extras() {
            let slot = key.extras_slot() as usize;
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Uniform, n)) if n.as_deref() == Some("extras")),
                "{kernel:?} extras: {:?}",
                found[slot]
            );
        }
        if key.uses_pairs() {
            let slot = key.pairs_slot() as usize;
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Storage { access }, n))
                    if n.as_deref() == Some("pair_data") && !access.contains(naga::StorageAccess::STORE)),
                "{kernel:?} pair data: {:?}",
                found[slot]
            );
        }
        if key.keeps_grads {
            let slot = key.kept_grads_slot() as usize;
            assert_eq!(slot, found.len() - 1);
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Storage { access }, n))
                    if n.as_deref() == Some("kept_grads") && access.contains(naga::StorageAccess::STORE)),
                "{kernel:?} bias gradients: {:?}",
                found[slot]
            );
        }
        assert!(found.iter().all(Option::is_some), "{kernel:?}: {found:?}");
    }
}

/// The functions `block` calls, and theirs, into `out`.
fn calls(module: &naga::Module, block: &naga::Block, out: &mut Vec<naga::Handle<naga::Function>>) {
    for st in block.iter() {
        match st {
            naga::Statement::Call { function, .. } if !out.contains(function) => {
                out.push(*function);
                calls(module, &module.functions[*function].body, out);
            }
            naga::Statement::Block(b) => calls(module, b, out),
            naga::Statement::If { accept, reject, .. } => {
                calls(module, accept, out);
                calls(module, reject, out);
            }
            naga::Statement::Switch { cases, .. } => {
                for c in cases {
                    calls(module, &c.body, out);
                }
            }
            naga::Statement::Loop {
                body, continuing, ..
            } => {
                calls(module, body, out);
                calls(module, continuing, out);
            }
            _ => {}
        }
    }
}

/// Bits a kernel's entry point reaches that it need not declare: reached only where
/// `begin_head` records per-head state that the kernel's code never reads.
const HARMLESS: [(Kernel, u32, &str); 4] = [
    (
        Kernel::FlashBwdSinks,
        flags::DROPOUT | flags::BIAS,
        "begin_head's dropout stream and bias grid",
    ),
    (
        Kernel::FlashDecodeCombine,
        flags::DROPOUT | flags::BIAS,
        "begin_head's dropout stream and bias grid",
    ),
    (
        Kernel::NaiveBwdProbs,
        flags::DROPOUT,
        "begin_head's dropout stream",
    ),
    (
        Kernel::NaiveBwdDkDv,
        flags::BIAS | flags::PAGED,
        "begin_head's bias grid; kv_index of dk and dv (a paged backward is refused)",
    ),
];

#[test]
fn each_kernel_reads_exactly_the_modifier_bits_it_declares() {
    // The bits a kernel declares (Kernel::reads_flags) decide which bits it reads at run time
    // and which are compiled in: one its entry point reaches but does not declare would be a
    // constant false (a wrong result), and a compiled bit it declares but never reaches would
    // compile the same code twice.
    for kernel in Kernel::ALL {
        let key = key_of(kernel, ElemFormat::F32, true);
        let module = parse_and_validate(&key);
        let mut reached = Vec::new();
        for ep in &module.entry_points {
            calls(&module, &ep.function.body, &mut reached);
        }
        let bits = reached
            .iter()
            .filter_map(|h| module.functions[*h].name.as_deref())
            .filter_map(|n| flags::ALL.iter().find(|(_, name)| *name == n))
            .fold(0, |m, (b, _)| m | b);
        let declared = kernel.reads_flags();
        let harmless = HARMLESS
            .iter()
            .filter(|(k, _, _)| *k == kernel)
            .fold(0, |m, (_, b, _)| m | b);
        assert_eq!(
            bits & !declared & !harmless,
            0,
            "{kernel:?} reaches [{}] but declares [{}]",
            flags::names(bits),
            flags::names(declared)
        );
        assert_eq!(
            declared & flags::COMPILED & !bits,
            0,
            "{kernel:?} declares compiled bits it never reaches: [{}]",
            flags::names(declared & flags::COMPILED & !bits)
        );
    }
}

/// True when `e` of `f` is, or is built on, the module constant `c`.
fn uses_constant(f: &naga::Function, c: naga::Handle<naga::Constant>) -> bool {
    f.expressions
        .iter()
        .any(|(_, e)| matches!(e, naga::Expression::Constant(h) if *h == c))
}

#[test]
fn kernels_that_share_a_pipeline_across_head_dims_never_read_head_dim() {
    // Kernel::reads_head_dim false: planned with head_dim 1, so no function their entry
    // point reaches may use HEAD_DIM
    for kernel in Kernel::ALL.into_iter().filter(|k| !k.reads_head_dim()) {
        let key = key_of(kernel, ElemFormat::F32, true);
        let module = parse_and_validate(&key);
        let Some((c, _)) = module
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some("HEAD_DIM"))
        else {
            continue;
        };
        let mut reached = Vec::new();
        for ep in &module.entry_points {
            assert!(
                !uses_constant(&ep.function, c),
                "{kernel:?} main uses HEAD_DIM"
            );
            calls(&module, &ep.function.body, &mut reached);
        }
        for h in reached {
            let f = &module.functions[h];
            assert!(
                !uses_constant(f, c),
                "{kernel:?} reaches {:?}, which uses HEAD_DIM",
                f.name
            );
        }
    }
}

#[test]
fn kernels_that_share_a_pipeline_across_value_dims_never_read_them() {
    // Kernel::reads_value_dim false: planned with head_dim_v 0 (HEAD_DIM_V = HEAD_DIM), so no
    // function their entry point reaches may use the values' dims or what derives from them
    let names = ["HEAD_DIM_V", "D4V", "RSV", "GPTV"];
    for kernel in Kernel::ALL
        .into_iter()
        .filter(|k| k.reads_head_dim() && !k.reads_value_dim())
    {
        let key = key_of(kernel, ElemFormat::F32, true);
        let module = parse_and_validate(&key);
        for (c, constant) in module.constants.iter() {
            if !names.contains(&constant.name.as_deref().unwrap_or("")) {
                continue;
            }
            let mut reached = Vec::new();
            for ep in &module.entry_points {
                assert!(
                    !uses_constant(&ep.function, c),
                    "{kernel:?} main uses {:?}",
                    constant.name
                );
                calls(&module, &ep.function.body, &mut reached);
            }
            for h in reached {
                let f = &module.functions[h];
                assert!(
                    !uses_constant(f, c),
                    "{kernel:?} reaches {:?}, which uses {:?}",
                    f.name,
                    constant.name
                );
            }
        }
    }
}

#[test]
fn every_kernel_fits_the_webgpu_default_of_8_storage_buffers_with_a_mask_and_a_bias() {
    for kernel in Kernel::ALL {
        let key = key_of(kernel, ElemFormat::F32, true);
        assert!(key.storage_bindings() <= 8, "{kernel:?}");
    }
}

#[test]
fn params_layout_matches_the_shader_struct() {
    let key = key_of(
        Kernel::Flash(Variant::Blocks, Pass::Forward),
        ElemFormat::F32,
        false,
    );
    let module = parse_and_validate(&key);
    let (_, ty) = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some("Params"))
        .expect("Params struct in common.wgsl");
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("Params is not a struct")
    };
    macro_rules! offsets {
        ($($f:ident),*) => { vec![$((stringify!($f), std::mem::offset_of!(Params, $f))),*] };
    }
    let host = offsets!(
        batch,
        seq_q,
        seq_kv,
        heads_q,
        heads_kv,
        head_dim,
        group,
        causal_offset,
        scale,
        scale_log2,
        n_q_tiles,
        n_kv_tiles,
        total_wg,
        slice_base,
        slice_count,
        total_items,
        q_shift,
        kv_shift,
        row_shift,
        row_stride,
        resume,
        band_lo,
        band_hi,
        softcap2,
        batch_base,
        alibi_b_stride,
        sinks_base,
        seqlens_base,
        kv_base,
        q_base,
        drop_threshold,
        drop_scale,
        seed_lo,
        seed_hi,
        offset_lo,
        offset_hi,
        blocks_base,
        block_q,
        block_kv,
        blocks_cols,
        blocks_b_stride,
        blocks_h_stride,
        blocks_full,
        pairs_base,
        block_q_shift,
        block_kv_shift,
        varlen_base,
        sequences,
        pair_shift,
        mask_b_stride,
        mask_h_stride,
        mask_cols,
        bias_base,
        bias_b_stride,
        bias_h_stride,
        merge_last,
        splits,
        split_keys,
        align_kv,
        align_min_shift,
        pages_base,
        page_size,
        pages_per_seq,
        rotary_dim,
        rotary_interleaved,
        rotary_step,
        captured_base,
        flags,
        views
    );
    assert_eq!(members.len(), host.len());
    for (m, (name, off)) in members.iter().zip(host) {
        assert_eq!(m.name.as_deref(), Some(name));
        assert_eq!(m.offset as usize, off, "{name}");
    }
    assert_eq!(*span as usize, std::mem::size_of::<Params>());
}
