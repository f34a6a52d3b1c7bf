//! Every generated shader variant is valid WGSL with the bindings the host declares, and the
//! host's `Params` mirrors the shader's. Runs without a GPU (naga only).

mod common;
use common::variants::variants;
use flash_attn_wgpu::dtype::ElemFormat;
use flash_attn_wgpu::kernels::{choose_tiles, Access, DeviceCaps, Kernel, KernelKey, Params};

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
    let keys = variants();
    assert!(keys.len() > 800, "{} variants", keys.len());
    for key in &keys {
        parse_and_validate(key);
    }
}

#[test]
fn shader_bindings_match_the_host_layout() {
    for (kernel, elem, extras) in Kernel::ALL
        .into_iter()
        .flat_map(|k| ElemFormat::ALL.map(|e| (k, e)))
        .flat_map(|(k, e)| [(k, e, false), (k, e, true)])
    {
        let key = KernelKey {
            kernel,
            elem,
            head_dim: 64,
            tiles: choose_tiles(
                kernel,
                64,
                DeviceCaps {
                    coop_f16: kernel.is_coop(),
                    ..DeviceCaps::WEBGPU_DEFAULT
                },
            )
            .unwrap(),
            causal: false,
            window: false,
            softcap: false,
            alibi: extras,
            sinks: extras,
            seqlens: extras,
            dropout: extras,
            blocks: extras,
            varlen: extras,
            mask: extras,
            bias: extras,
            paged: extras,
            views: extras,
            wide: if extras { 2 } else { 0 },
            bias_grad: extras,
            subgroup: 0,
            accumulate: false,
        };
        let module = parse_and_validate(&key);
        // with extras (ALiBi slopes, sinks): one uniform binding past the storage ones, then
        // the pair data's (boolean mask bits, bias entries) read-only storage binding
        let mut found = vec![None; kernel.bindings().len() + 1 + 3 * extras as usize];
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
        if extras {
            let slot = key.extras_slot() as usize;
            assert_eq!(slot, found.len() - 3);
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Uniform, n)) if n.as_deref() == Some("extras")),
                "{kernel:?} extras: {:?}",
                found[slot]
            );
            let slot = key.pairs_slot() as usize;
            assert_eq!(slot, found.len() - 2);
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Storage { access }, n))
                    if n.as_deref() == Some("pair_data") && !access.contains(naga::StorageAccess::STORE)),
                "{kernel:?} pair data: {:?}",
                found[slot]
            );
            let slot = key.bias_grads_slot() as usize;
            assert_eq!(slot, found.len() - 1);
            assert!(
                matches!(&found[slot], Some((naga::AddressSpace::Storage { access }, n))
                    if n.as_deref() == Some("bias_grads") && access.contains(naga::StorageAccess::STORE)),
                "{kernel:?} bias gradients: {:?}",
                found[slot]
            );
        }
    }
}

#[test]
fn every_kernel_fits_the_webgpu_default_of_8_storage_buffers_with_a_mask_and_a_bias() {
    for kernel in Kernel::ALL {
        let key = KernelKey {
            mask: true,
            bias: true,
            bias_grad: kernel.keeps_bias_grads(),
            ..KernelKey::plain(kernel)
        };
        assert!(key.storage_bindings() <= 8, "{kernel:?}");
    }
}

#[test]
fn params_layout_matches_the_shader_struct() {
    let key = KernelKey {
        kernel: Kernel::FlashFwd,
        elem: ElemFormat::F32,
        head_dim: 64,
        tiles: choose_tiles(Kernel::FlashFwd, 64, DeviceCaps::WEBGPU_DEFAULT).unwrap(),
        causal: false,
        window: false,
        softcap: false,
        alibi: false,
        sinks: false,
        seqlens: false,
        dropout: false,
        blocks: false,
        varlen: false,
        mask: false,
        bias: false,
        paged: false,
        views: false,
        wide: 0,
        bias_grad: false,
        subgroup: 0,
        accumulate: false,
    };
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
        views_pad,
        views
    );
    assert_eq!(members.len(), host.len());
    for (m, (name, off)) in members.iter().zip(host) {
        assert_eq!(m.name.as_deref(), Some(name));
        assert_eq!(m.offset as usize, off, "{name}");
    }
    assert_eq!(*span as usize, std::mem::size_of::<Params>());
}
