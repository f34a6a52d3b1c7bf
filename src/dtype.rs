//! Element types of the attention tensors and how each is stored on the device.
//!
//! q, k, v, out, d_out, dq, dk and dv take one element type per call; lse and delta are always
//! f32. Kernels read every element into f32, accumulate in f32, and round each output once,
//! to nearest even, when they store it.

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
}

impl DType {
    /// Every dtype, in the order tests walk them.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element on the host (and on the device, padded to 4 per buffer).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Its name as errors and logs print it: `f32`, `f16`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// Unit roundoff: the largest relative error of one round-to-nearest into this type.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => f64::powi(2.0, -24),
            DType::F16 => f64::powi(2.0, -11),
            DType::BF16 => f64::powi(2.0, -8),
        }
    }

    /// Device bytes of a buffer of `elements` of this type (4-byte multiples, at least 4).
    pub fn buffer_bytes(self, elements: u64) -> Option<u64> {
        let bytes = elements.checked_mul(self.size_bytes() as u64)?;
        Some(bytes.max(4).next_multiple_of(4))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "f16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            other => Err(format!(
                "unknown dtype {other:?}: expected f32, f16 or bf16"
            )),
        }
    }
}

/// How half-precision tensors are laid out in device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HalfStorage {
    /// `array<f16>` in the shader (needs the adapter's `SHADER_F16`).
    Native,
    /// Two halves per `u32` word, element `i` in bits `16 * (i % 2)..` of word `i / 2`
    /// (`unpack2x16float` order). Works on every adapter; bf16 always uses it.
    Packed,
}

/// How one pipeline reads and writes its element-typed bindings (internal).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemFormat {
    F32,
    F16Native,
    F16Packed,
    Bf16Packed,
}

impl ElemFormat {
    pub const ALL: [ElemFormat; 4] = [
        ElemFormat::F32,
        ElemFormat::F16Native,
        ElemFormat::F16Packed,
        ElemFormat::Bf16Packed,
    ];

    pub fn new(dtype: DType, half: HalfStorage) -> Self {
        match (dtype, half) {
            (DType::F32, _) => ElemFormat::F32,
            (DType::F16, HalfStorage::Native) => ElemFormat::F16Native,
            (DType::F16, HalfStorage::Packed) => ElemFormat::F16Packed,
            (DType::BF16, _) => ElemFormat::Bf16Packed,
        }
    }

    pub fn dtype(self) -> DType {
        match self {
            ElemFormat::F32 => DType::F32,
            ElemFormat::F16Native | ElemFormat::F16Packed => DType::F16,
            ElemFormat::Bf16Packed => DType::BF16,
        }
    }

    pub fn is_packed(self) -> bool {
        matches!(self, ElemFormat::F16Packed | ElemFormat::Bf16Packed)
    }

    pub fn name(self) -> &'static str {
        match self {
            ElemFormat::F32 => "f32",
            ElemFormat::F16Native => "f16",
            ElemFormat::F16Packed => "f16-packed",
            ElemFormat::Bf16Packed => "bf16-packed",
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A host element type the library takes: `f32`, `half::f16` or `half::bf16`.
pub trait Element: sealed::Sealed + bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The dtype this host type is.
    const DTYPE: DType;
    /// Round-to-nearest-even conversion from f32.
    fn from_f32(x: f32) -> Self;
    /// Exact conversion to f32.
    fn to_f32(self) -> f32;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// Converts a slice of f32 to `T`, rounding to nearest even.
pub fn from_f32_slice<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

/// Converts a slice of `T` to f32 (exact).
pub fn to_f32_vec<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_bytes_round_half_tensors_up_to_whole_words() {
        assert_eq!(DType::F16.buffer_bytes(1), Some(4));
        assert_eq!(DType::F16.buffer_bytes(3), Some(8));
        assert_eq!(DType::BF16.buffer_bytes(4), Some(8));
        assert_eq!(DType::F32.buffer_bytes(3), Some(12));
        assert_eq!(DType::F32.buffer_bytes(u64::MAX), None);
    }

    #[test]
    fn dtype_names_parse_back() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f64".parse::<DType>().is_err());
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        // 1 + 2^-11 is halfway between f16 1.0 and the next value: ties go to even (1.0).
        let x = 1.0 + f32::powi(2.0, -11);
        assert_eq!(half::f16::from_f32(x).to_f32(), 1.0);
        let y = 1.0 + 3.0 * f32::powi(2.0, -11);
        assert_eq!(half::f16::from_f32(y).to_f32(), 1.0 + f32::powi(2.0, -9));
    }
}
