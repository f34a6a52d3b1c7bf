//! Which flash-attention `Context` serves which burn device: one per wgpu device burn runs on,
//! built on burn's own device and queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::backend::DispatchDevice;
use burn::tensor::wgpu::{WgpuOptions, WgpuSetup};
use burn::tensor::Device;
use flash_attn_wgpu::{Context, Error, Result};

type Registry = Mutex<HashMap<cubecl::Device, Arc<Context>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Brings up burn's wgpu runtime on the default adapter and a flash-attention context on the
/// same device and queue; returns burn's device (call `.autodiff()` on it to train).
///
/// # Errors
/// [`Error::RequestDevice`] when burn's runtime cannot start (or already started on this
/// adapter without us: then make the setup yourself and [`register`] it); the library's
/// device checks.
pub fn init() -> Result<Device> {
    init_with(Device::wgpu_options())
}

/// [`init`] with burn's runtime options (adapter kind, graphics API, memory policy).
pub fn init_with(options: WgpuOptions) -> Result<Device> {
    let (device, setup) = options
        .init_with_setup()
        .map_err(|e| Error::RequestDevice(format!("burn's wgpu runtime: {e}")))?;
    register(&device, setup)?;
    Ok(device)
}

/// Serves `device` with a flash-attention context on `setup`'s device and queue: for an
/// application that brought up burn's runtime itself (`Device::wgpu_options()
/// .init_with_setup()`, or `.setup(...)` on its own wgpu device). `setup` must be the one
/// burn's runtime for `device` runs on.
pub fn register(device: &Device, setup: WgpuSetup) -> Result<()> {
    let key = cube_device(device)?;
    let ctx = Context::from_wgpu(setup.device, setup.queue)?;
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, Arc::new(ctx));
    Ok(())
}

/// The context serving the cubecl device `key`.
pub(crate) fn for_device(key: &cubecl::Device) -> Result<Arc<Context>> {
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    map.get(key).cloned().ok_or_else(|| {
        Error::InvalidConfig(format!(
            "burn device {key:?} has no flash-attention context: create it with \
             flash_attn_burn::init() (or register its wgpu setup with flash_attn_burn::register) \
             so that burn and the attention kernels share one wgpu device and queue"
        ))
    })
}

/// The cubecl device under a burn device (autodiff or not).
pub(crate) fn cube_device(device: &Device) -> Result<cubecl::Device> {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Cube(d @ cubecl::Device::Wgpu(_)) => Ok(d.clone()),
        other => Err(Error::Unsupported {
            feature: format!("flash attention on burn device {other:?}"),
            backend: flash_attn_wgpu::Backend::Wgpu,
            reason: "this crate runs on burn's wgpu backend (flash_attn_burn::init)".into(),
        }),
    }
}
