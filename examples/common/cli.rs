//! Argument parsers shared by the examples (each example includes this file as `mod cli`).

/// A whole number of at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("{s:?} is not a whole number: {e}")),
    }
}
