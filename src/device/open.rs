//! Opening the default adapter (`Context::new`): pick it, ask for the features the kernels use,
//! let the coop kernels prove themselves on a probe device of their own (coop.rs), request the
//! device and run the driver canary. Above the context (mod.rs: the struct, `build`,
//! `request`) and the coop self-check, which both make contexts, so that neither imports this.

use super::coop;
use super::{check_device_limits, request, Context};
use crate::error::{Error, Result};
use crate::kernels::{Tuning, Variant};

const WANTED_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::TIMESTAMP_QUERY);

impl Context {
    /// Picks the default adapter (honouring `WGPU_BACKEND`, `WGPU_ADAPTER_NAME` and
    /// `WGPU_POWER_PREF`), requests its real limits and the optional features we use, and
    /// runs the driver canary. Blocking.
    pub fn new() -> Result<Self> {
        pollster::block_on(Self::new_async())
    }

    /// [`Context::new`] as a future: in a browser (wasm32, the WebGPU backend) it never blocks
    /// (the canary's readback is awaited); on native the canary waits for the device when
    /// polled.
    pub async fn new_async() -> Result<Self> {
        let Chosen {
            adapter,
            mut features,
            limits,
            coop,
        } = choose_adapter().await?;
        // On a GPU the coop kernels become the default, so they prove themselves on a device
        // of their own first: a kernel must not be able to take the caller's device down with
        // it (a driver fault loses only the probe device), nor hang this call (a deadline).
        // On a CPU driver (lavapipe 26: 8x8x8) the rows family stays the default and the coop
        // kernels run only when asked for (`Variant::Coop`), so no call pays for the check.
        let cpu = adapter.get_info().device_type == wgpu::DeviceType::Cpu;
        let coop_verdict = if coop > 0 && !cpu {
            Some(coop::verdict(&adapter, features, &limits, coop).await)
        } else {
            None
        };
        let coop_usable = coop > 0 && (cpu || matches!(coop_verdict, Some(Ok(()))));
        if !coop_usable {
            features.remove(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        }
        let (device, queue) = request(&adapter, features, &limits, coop_usable).await?;
        check_device_limits(&device.limits())?;
        // (`build` takes the size only where the device has the feature, removed above)
        let mut ctx = Self::build(device, queue, Some(adapter.get_info()), coop);
        ctx.driver_canary_async().await?;
        let shape = coop::shape_name(coop);
        match coop_verdict {
            Some(Ok(())) => {
                ctx.info.cooperative_matrices = format!("{shape}, in use (Variant::Coop)");
                let t = ctx.tuning();
                ctx.set_tuning_unchecked(Tuning {
                    variant: Variant::Coop,
                    ..t
                });
            }
            Some(Err(why)) => {
                ctx.info.cooperative_matrices = format!("{shape} offered, not used: {why}")
            }
            None if coop_usable => {
                ctx.info.cooperative_matrices = format!(
                    "{shape}, offered (a CPU driver: not the default; Variant::Coop when asked)"
                )
            }
            None => {}
        }
        ctx.apply_variant_env()?;
        Ok(ctx)
    }
}

/// The adapter `Context::new` opens, the features it asks for, its limits, and the fragment
/// size of the cooperative matrices the coop kernels would use there (0: none; on a GPU they
/// then still have to pass their self-check): what every way of opening the default adapter
/// shares.
pub(super) struct Chosen {
    pub adapter: wgpu::Adapter,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    pub coop: u32,
}

pub(super) async fn choose_adapter() -> Result<Chosen> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pick_adapter(&instance).await?;
    let mut features = adapter.features() & WANTED_FEATURES;
    // Vulkan takes our layout-clean SPIR-V through the passthrough path (device/spirv.rs)
    if adapter.get_info().backend == wgpu::Backend::Vulkan {
        features |= adapter.features() & wgpu::Features::PASSTHROUGH_SHADERS;
    }
    // Cooperative matrices are an experimental wgpu feature: asked for only where the
    // adapter offers a configuration the coop kernels use, and on a GPU picked only after they
    // pass their self-check.
    let coop = if adapter.features().contains(
        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP,
    ) {
        coop::fragment_size(&adapter.cooperative_matrix_properties())
    } else {
        0
    };
    if coop > 0 {
        features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    let limits = adapter.limits();
    Ok(Chosen {
        adapter,
        features,
        limits,
        coop,
    })
}

async fn pick_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    if let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") {
        let wanted_lc = wanted.to_lowercase();
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&wanted_lc))
            .ok_or_else(|| Error::NoAdapter {
                detail: format!(
                    "WGPU_ADAPTER_NAME={wanted:?} matches none of the adapters found: {names:?}"
                ),
            });
    }
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::from_env()
                .unwrap_or(wgpu::PowerPreference::HighPerformance),
            force_fallback_adapter: false,
            compatible_surface: None,
            // We want the adapter's real limits (workgroup storage, binding sizes).
            apply_limit_buckets: false,
        })
        .await
        .map_err(|e| Error::NoAdapter {
            detail: e.to_string(),
        })
}
