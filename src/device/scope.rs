//! Error scopes and waiting: the one place where wgpu errors become `Result`s.

use super::Context;
use crate::error::{Error, Result};

impl Context {
    pub(crate) fn check_alive(&self) -> Result<()> {
        if let Ok(l) = self.lost.lock() {
            if let Some(msg) = l.as_ref() {
                return Err(Error::Device(msg.clone()));
            }
        }
        Ok(())
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns any
    /// captured error into `Err`.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let out = f();
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        if let Some(e) = oom {
            return Err(Error::OutOfMemory(e.to_string()));
        }
        if let Some(e) = validation {
            return Err(Error::Validation(e.to_string()));
        }
        if let Some(e) = internal {
            return Err(Error::Device(e.to_string()));
        }
        self.check_alive()?;
        Ok(out)
    }
}
