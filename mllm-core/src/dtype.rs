//! Data types with the codes of mllm's `.mllm` container.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// The element type of a tensor.
///
/// The discriminants are the dtype codes stored in `.mllm` files (mllm v1
/// codes 0..=30, and mllm v2's BF16 = 128 and U8 = 129). Quantized types use
/// ggml's block layouts. Codes from 192 on are mllm-rs's own: weights
/// stored in the layout of its packed kernels, so that they load by
/// mapping alone (`mllm-convert --packed`), and ggml formats that mllm has
/// no code for (IQ4_NL, IQ4_XS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    I8 = 16,
    I16 = 17,
    I32 = 18,
    Q3K = 23,
    Q2K = 24,
    BF16 = 128,
    U8 = 129,
    /// Q4_0 or Q4_1 rows in groups of eight (`[rows, cols]`, rows a multiple
    /// of 8): per group and block of 32 columns, eight f16 scales, eight f16
    /// offsets (`−8·d` for Q4_0) and the nibbles word-interleaved, 160 bytes
    /// for 256 values.
    Q4Packed = 192,
    /// Q8_0 rows in groups of eight: per group and block of 32 columns,
    /// eight f16 scales and the quants word-interleaved, 272 bytes for 256
    /// values.
    Q8Packed = 193,
    /// ggml's IQ4_NL: 32 values per 18 bytes, an f16 scale and nibbles
    /// indexing a fixed non-linear grid.
    IQ4NL = 194,
    /// ggml's IQ4_XS: 256 values per 136 bytes, IQ4_NL's grid with 6-bit
    /// sub-block scales.
    IQ4XS = 195,
}

impl DType {
    /// Every dtype mllm-rs knows, in code order.
    pub const ALL: [DType; 23] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::Q3K,
        DType::Q2K,
        DType::BF16,
        DType::U8,
        DType::Q4Packed,
        DType::Q8Packed,
        DType::IQ4NL,
        DType::IQ4XS,
    ];

    /// The code stored in a `.mllm` index entry.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The dtype for a stored code, or `None` for an unknown code.
    pub fn from_code(code: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Number of elements in one block (1 for plain types).
    pub fn block_len(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL => 32,
            DType::Q8_0 | DType::Q8_1 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K | DType::Q8K | DType::Q3K | DType::Q2K => 256,
            DType::Q4Packed | DType::Q8Packed | DType::IQ4XS => 256,
            _ => 1,
        }
    }

    /// Bytes in one block (ggml's layouts for quantized types).
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
            DType::Q8K => 292,
            DType::Q3K => 110,
            DType::Q2K => 84,
            DType::Q4Packed => 160,
            DType::Q8Packed => 272,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
        }
    }

    /// Whether this is one of mllm-rs's packed weight layouts.
    pub fn is_packed(self) -> bool {
        matches!(self, DType::Q4Packed | DType::Q8Packed)
    }

    /// Bytes needed for `numel` elements, or an error when `numel` is not a
    /// whole number of blocks or the byte count overflows `usize`.
    pub fn bytes_for(self, numel: usize) -> Result<usize> {
        let block = self.block_len();
        if !numel.is_multiple_of(block) {
            return Err(Error::UnsupportedDType(format!(
                "{self}: {numel} elements are not a multiple of the block size {block}"
            )));
        }
        (numel / block)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "{self}: {numel} elements need more bytes than fit in memory"
                ))
            })
    }

    /// The lowercase name used on command lines and in metadata.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
            DType::Q8K => "q8_k",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::Q3K => "q3_k",
            DType::Q2K => "q2_k",
            DType::BF16 => "bf16",
            DType::U8 => "u8",
            DType::Q4Packed => "q4_packed",
            DType::Q8Packed => "q8_0_packed",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<DType> {
        let lower = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.name() == lower)
            .ok_or_else(|| Error::InvalidInput(format!("unknown dtype name '{s}'")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_mllm() {
        assert_eq!(DType::F32.code(), 0);
        assert_eq!(DType::Q4_1.code(), 3);
        assert_eq!(DType::Q8_0.code(), 8);
        assert_eq!(DType::Q5_0.code(), 6);
        assert_eq!(DType::Q5_1.code(), 7);
        assert_eq!(DType::Q5K.code(), 13);
        assert_eq!(DType::Q6K.code(), 14);
        assert_eq!(DType::Q2K.code(), 24);
        assert_eq!(DType::BF16.code(), 128);
        assert_eq!(DType::U8.code(), 129);
        assert_eq!(DType::Q4Packed.code(), 192);
        assert_eq!(DType::Q8Packed.bytes_for(512).unwrap(), 544);
        assert_eq!(DType::from_code(4), None);
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::F16.bytes_for(10).unwrap(), 20);
        assert_eq!(DType::Q4_0.bytes_for(64).unwrap(), 36);
        assert_eq!(DType::Q5_0.bytes_for(64).unwrap(), 44);
        assert_eq!(DType::Q5_1.bytes_for(64).unwrap(), 48);
        assert_eq!(DType::Q5K.bytes_for(512).unwrap(), 352);
        assert_eq!(DType::Q3K.bytes_for(256).unwrap(), 110);
        assert_eq!(DType::Q2K.bytes_for(256).unwrap(), 84);
        assert_eq!(DType::IQ4NL.bytes_for(64).unwrap(), 36);
        assert_eq!(DType::IQ4XS.bytes_for(512).unwrap(), 272);
        assert!(DType::Q4_0.bytes_for(33).is_err());
        // A count from a hostile file: an error, not an overflow.
        let err = DType::F32
            .bytes_for(usize::MAX / 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more bytes than fit in memory"), "{err}");
    }
}
