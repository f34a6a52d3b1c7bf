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

/// A wgpu error as one line: its message and every cause under it. Never empty: a wgpu error
/// whose message and causes are all blank still says which kind it was.
pub(crate) fn describe(e: &wgpu::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut push = |s: String| {
        let s = s.trim().to_string();
        if !s.is_empty() && !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    };
    push(e.to_string());
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        push(cause.to_string());
        source = cause.source();
    }
    if parts.is_empty() {
        let kind = match e {
            wgpu::Error::OutOfMemory { .. } => "out of memory",
            wgpu::Error::Validation { .. } => "validation",
            wgpu::Error::Internal { .. } => "internal",
        };
        return format!("wgpu reported a {kind} error without a message");
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn a_wgpu_error_without_a_message_still_says_what_it_was() {
        let e = wgpu::Error::Validation {
            source: Box::new(std::io::Error::other("")),
            description: String::new(),
        };
        assert_eq!(
            describe(&e),
            "wgpu reported a validation error without a message"
        );
        let e = wgpu::Error::Validation {
            source: Box::new(std::io::Error::other("buffer 7 is destroyed")),
            description: "in a bind group".into(),
        };
        assert_eq!(describe(&e), "in a bind group: buffer 7 is destroyed");
    }
}
