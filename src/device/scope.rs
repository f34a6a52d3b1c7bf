//! Error scopes and waiting: the one place where wgpu errors become `Result`s.

use super::wgpu_error::describe;
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
    /// captured error into `Err`. Native wgpu resolves the scopes at once, so the waits below
    /// return immediately.
    #[cfg(not(target_arch = "wasm32"))]
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
            return Err(Error::OutOfMemory(describe(&e)));
        }
        if let Some(e) = validation {
            return Err(Error::Validation(describe(&e)));
        }
        if let Some(e) = internal {
            return Err(Error::Device(describe(&e)));
        }
        self.check_alive()?;
        Ok(out)
    }
}

impl Context {
    /// In a browser an error scope resolves only on the event loop, which a call must not
    /// wait for: the device's uncaptured-error handler (set in `build`) records what the GPU
    /// reports, and the first call after it arrives returns it. Every input error is found
    /// on the host before any GPU work, as everywhere.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        self.take_uncaptured()?;
        let out = f();
        self.take_uncaptured()?;
        Ok(out)
    }

    #[cfg(target_arch = "wasm32")]
    fn take_uncaptured(&self) -> Result<()> {
        match self.uncaptured.lock().ok().and_then(|mut e| e.take()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
