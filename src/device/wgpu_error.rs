//! wgpu's errors in our words: one line of a wgpu error's message and causes. Below the
//! error scopes (scope.rs) and the context's uncaptured-error handler (mod.rs), which both
//! turn wgpu errors into `Error`s.

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
