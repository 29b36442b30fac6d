//! The storage type of the KV cache, chosen at run time (`--kv-dtype`).

use std::fmt;
use std::str::FromStr;

use crate::{DType, Error, Result};

/// How cached keys and values are stored. Attention reads every type
/// directly, decoding one tile of rows at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats, exactly what the step computed (the default).
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// ggml's Q8_0 blocks: 32 values share an f16 scale, 8-bit values.
    Q8_0,
    /// ggml's Q4_1 blocks: 32 values share an f16 scale and minimum, 4-bit
    /// values (group-wise asymmetric 4-bit, as FlexGen compresses its cache).
    Q4_1,
}

impl KvDtype {
    /// Every storage type, in the order the help text lists them.
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1];

    /// The `.mllm` dtype whose layout a cached row uses.
    pub fn dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Q8_0 => DType::Q8_0,
            KvDtype::Q4_1 => DType::Q4_1,
        }
    }

    /// Values per block (1 for the float types, 32 for the block types):
    /// a head dimension must be a multiple of it.
    pub fn block_len(self) -> usize {
        self.dtype().block_len()
    }

    /// Bytes one cached row of `values` values takes (`values` a multiple
    /// of [`KvDtype::block_len`]).
    pub fn row_bytes(self, values: usize) -> usize {
        values / self.block_len() * self.dtype().block_bytes()
    }

    /// Checks that heads of `head_dim` values are whole blocks, so that
    /// one head's part of a row can be decoded on its own.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if head_dim.is_multiple_of(self.block_len()) {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "KV cache type {self} stores blocks of {} values, which do not divide the head dimension {head_dim}; use f32 or f16",
                self.block_len()
            )))
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_1 => "q4",
        })
    }
}

impl FromStr for KvDtype {
    type Err = Error;

    /// `f32`, `f16`, `q8_0` or `q4` (also `q4_1`), any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "q8_0" => Ok(KvDtype::Q8_0),
            "q4" | "q4_1" => Ok(KvDtype::Q4_1),
            _ => Err(Error::InvalidInput(format!(
                "unknown KV cache type '{s}': expected one of f32, f16, q8_0, q4"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for kv in KvDtype::ALL {
            assert_eq!(kv.to_string().parse::<KvDtype>().unwrap(), kv);
        }
        assert_eq!("Q4_1".parse::<KvDtype>().unwrap(), KvDtype::Q4_1);
        let err = "q5".parse::<KvDtype>().unwrap_err().to_string();
        assert!(err.contains("unknown KV cache type 'q5'"), "{err}");
    }

    #[test]
    fn row_sizes_of_a_smollm2_row() {
        // 3 KV heads of 64: 192 values.
        let bytes = KvDtype::ALL.map(|kv| kv.row_bytes(192));
        assert_eq!(bytes, [768, 384, 6 * 34, 6 * 20]);
    }

    #[test]
    fn block_types_need_whole_blocks_per_head() {
        assert!(KvDtype::Q8_0.check_head_dim(64).is_ok());
        assert!(KvDtype::F16.check_head_dim(20).is_ok());
        let err = KvDtype::Q4_1.check_head_dim(20).unwrap_err().to_string();
        assert!(err.contains("head dimension 20"), "{err}");
    }
}
