//! A `Context` over the default adapter with chosen limits (examples include this file as
//! `mod device`): the features `Context::new` asks for, and the limits `limits` makes from the
//! adapter's own.

use flash_attn_wgpu::Context;

pub fn context_with_limits(
    limits: impl FnOnce(wgpu::Limits) -> wgpu::Limits,
) -> Result<Context, Box<dyn std::error::Error>> {
    pollster::block_on(async {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions::default())
            .await?;
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("example device"),
                required_features: adapter.features() & wanted,
                required_limits: limits(adapter.limits()),
                ..Default::default()
            })
            .await?;
        Ok(Context::from_wgpu(device, queue)?)
    })
}
