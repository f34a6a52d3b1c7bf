//! `FLASH_ATTN_WGPU_VARIANT`: the tiled variant a new context starts with, chosen from the
//! environment rather than from the adapter's type, so that a test suite or a benchmark runs
//! the other family on one driver without code (the README test command runs the suite on
//! SwiftShader with each family in turn). `Context::set_tuning` does the same from code.

use crate::error::{Error, Result};
use crate::kernels::Variant;

/// `FLASH_ATTN_WGPU_VARIANT=rows|blocks|coop`: the variant `Context::new` and
/// `Context::from_wgpu` start with in place of the adapter's default. Unset or empty: the
/// default. An unknown name is an `InvalidConfig` error from the constructor, and `coop`
/// where the adapter's cooperative matrices are not in use an `Unsupported` one
/// (`Context::set_tuning`'s checks).
pub const VARIANT_ENV: &str = "FLASH_ATTN_WGPU_VARIANT";

/// The variant the environment asks for, if any.
pub(super) fn requested() -> Result<Option<Variant>> {
    parse(std::env::var(VARIANT_ENV).ok().as_deref())
}

fn parse(value: Option<&str>) -> Result<Option<Variant>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.to_ascii_lowercase().as_str() {
        "rows" => Ok(Some(Variant::Rows)),
        "blocks" => Ok(Some(Variant::Blocks)),
        "coop" => Ok(Some(Variant::Coop)),
        _ => Err(Error::invalid(format!(
            "{VARIANT_ENV} is {v:?}, expected rows, blocks or coop (or unset for the adapter's \
             default)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_anything_else_is_a_typed_error_naming_the_variable_and_value() {
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some(" ")).unwrap(), None);
        assert_eq!(parse(Some("rows")).unwrap(), Some(Variant::Rows));
        assert_eq!(parse(Some(" Blocks ")).unwrap(), Some(Variant::Blocks));
        assert_eq!(parse(Some("coop")).unwrap(), Some(Variant::Coop));
        let e = parse(Some("tiles")).unwrap_err().to_string();
        assert!(
            e.contains(VARIANT_ENV) && e.contains("\"tiles\"") && e.contains("blocks"),
            "{e}"
        );
    }
}
