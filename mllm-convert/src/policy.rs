//! The per-tensor storage policy: which dtype each tensor of a converted or
//! requantized `.mllm` file is stored in.
//!
//! A [`DTypePolicy`] names a storage type for matrices (`dtype`, the
//! command line's `--dtype`) and, optionally, other ones for the token
//! embedding (`--embed-dtype`) and the output head (`--head-dtype`). Each
//! tensor's role comes from its rank and its name ([`TensorRole::of`]):
//!
//! | role | names | stored as |
//! | --- | --- | --- |
//! | vector | any tensor of rank 0 or 1 (norm weights, biases) | F32 |
//! | token embedding | rank ≥ 2, ending in `embed_tokens.weight` or `wte.weight` | `embed_dtype`, else `dtype` |
//! | position embedding | rank ≥ 2, ending in `embed_positions.weight` or `wpe.weight` | as the token embedding, but F16 in place of a quantized type (the position-embedding op reads float tables) |
//! | output head | rank ≥ 2, ending in `lm_head.weight` | `head_dtype`, else `dtype` |
//! | matrix | every other tensor of rank ≥ 2 | `dtype` |
//!
//! A model with tied embeddings has no output head tensor: its head is the
//! token embedding, so only `embed_dtype` applies to it.
//!
//! **Fallback.** A block-quantized type stores each row (the last dimension)
//! as whole blocks of 32 values (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) or
//! 256 (q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs). A tensor whose rows are not
//! whole blocks of the chosen type is stored in:
//!
//! 1. a 32-value format when the rows are a multiple of 32: q4_k → q4_1
//!    and q5_k → q5_1 (values of the same width with a scale and a minimum
//!    per block), q6_k → q8_0 (there is no 6-bit 32-value format; the next
//!    more precise one), and q2_k, q3_k, iq4_xs → iq4_nl (as llama.cpp's
//!    quantizer does: the nearest 32-value format that is no less precise);
//! 2. otherwise F16.
//!
//! Such tensors are [`Storage::fallback`] and counted in
//! [`ConvertReport::fallbacks`](crate::ConvertReport::fallbacks).

use mllm_core::{DType, Error, Result};
use mllm_ops::quant::QuantType;

/// Every dtype a conversion can store matrices in, in the order error
/// messages list them.
pub const TARGET_DTYPES: [DType; 15] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4NL,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
];

/// `f32, f16, …, q6_k or iq4_xs`.
fn target_list() -> String {
    let names: Vec<&str> = TARGET_DTYPES.iter().map(|d| d.name()).collect();
    let (last, rest) = names.split_last().expect("the list is not empty");
    format!("{} or {last}", rest.join(", "))
}

/// Checks that `dtype` is one of the [`TARGET_DTYPES`].
pub fn check_target_dtype(dtype: DType) -> Result<()> {
    if TARGET_DTYPES.contains(&dtype) {
        return Ok(());
    }
    Err(Error::UnsupportedDType(format!(
        "{dtype} is not a conversion target; use {}",
        target_list()
    )))
}

/// Parses a target dtype name as given on the command line (`f32`, `f16`,
/// `bf16`, `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`, `q2_k`, `q3_k`,
/// `q4_k`, `q5_k`, `q6_k`, `iq4_xs`; case-insensitive).
pub fn parse_target_dtype(name: &str) -> Result<DType> {
    let dtype: DType = name.parse().map_err(|_| {
        Error::InvalidInput(format!("unknown dtype '{name}'; use {}", target_list()))
    })?;
    check_target_dtype(dtype)?;
    Ok(dtype)
}

/// What a tensor is to the policy, from its rank and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// Rank 0 or 1: norm weights and biases.
    Vector,
    /// The token embedding table.
    TokenEmbedding,
    /// A learned position embedding table.
    PositionEmbedding,
    /// The output head (absent when tied to the token embedding).
    OutputHead,
    /// Any other tensor of rank 2 or more.
    Matrix,
}

impl TensorRole {
    /// The role of the tensor `name` (as stored in the `.mllm` file) of
    /// `shape`; see the [module documentation](self) for the names.
    pub fn of(name: &str, shape: &[usize]) -> TensorRole {
        let ends = |suffixes: &[&str]| {
            suffixes
                .iter()
                .any(|s| name == *s || name.ends_with(&format!(".{s}")))
        };
        if shape.len() < 2 {
            TensorRole::Vector
        } else if ends(&["embed_tokens.weight", "wte.weight"]) {
            TensorRole::TokenEmbedding
        } else if ends(&["embed_positions.weight", "wpe.weight"]) {
            TensorRole::PositionEmbedding
        } else if ends(&["lm_head.weight"]) {
            TensorRole::OutputHead
        } else {
            TensorRole::Matrix
        }
    }
}

/// The storage types a conversion asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DTypePolicy {
    /// Type of matrices, and of the embedding and head when not set below.
    pub dtype: DType,
    /// Type of the token embedding (and of position embeddings, as a float).
    pub embed_dtype: Option<DType>,
    /// Type of an untied output head.
    pub head_dtype: Option<DType>,
    /// Store 2-D Q4_0, Q4_1 and Q8_0 weights whose row count is a multiple
    /// of eight in mllm-rs's packed layouts (`q4_packed`, `q8_0_packed`),
    /// which load by mapping alone (position tables excepted).
    pub packed: bool,
}

/// Where the policy puts one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Storage {
    /// The dtype the tensor is stored in.
    pub dtype: DType,
    /// The block type it is quantized to before packing: `dtype` itself
    /// unless `dtype` is a packed layout.
    pub base: DType,
    /// True when its rows are not whole blocks of the type its role asks
    /// for, so the fallback rule chose `dtype`.
    pub fallback: bool,
}

impl DTypePolicy {
    /// Every matrix, the embedding and the head in `dtype`.
    pub fn new(dtype: DType) -> Self {
        DTypePolicy {
            dtype,
            embed_dtype: None,
            head_dtype: None,
            packed: false,
        }
    }

    /// Checks that every type named is one of the [`TARGET_DTYPES`].
    pub fn check(&self) -> Result<()> {
        check_target_dtype(self.dtype)?;
        for (flag, dtype) in [("embedding", self.embed_dtype), ("head", self.head_dtype)] {
            if let Some(d) = dtype {
                check_target_dtype(d).map_err(|e| match e {
                    Error::UnsupportedDType(msg) => {
                        Error::UnsupportedDType(format!("{flag} dtype: {msg}"))
                    }
                    other => other,
                })?;
            }
        }
        Ok(())
    }

    /// The type the role asks for, before the fallback rule.
    pub fn requested(&self, role: TensorRole) -> DType {
        match role {
            TensorRole::Vector => DType::F32,
            TensorRole::TokenEmbedding => self.embed_dtype.unwrap_or(self.dtype),
            TensorRole::PositionEmbedding => {
                let d = self.embed_dtype.unwrap_or(self.dtype);
                if QuantType::from_dtype(d).is_some() {
                    DType::F16
                } else {
                    d
                }
            }
            TensorRole::OutputHead => self.head_dtype.unwrap_or(self.dtype),
            TensorRole::Matrix => self.dtype,
        }
    }

    /// Where the tensor `name` of `shape` is stored.
    pub fn storage(&self, name: &str, shape: &[usize]) -> Storage {
        let role = TensorRole::of(name, shape);
        let requested = self.requested(role);
        let row = shape.last().copied().unwrap_or(1);
        let (base, fallback) = if row.is_multiple_of(requested.block_len()) {
            (requested, false)
        } else {
            let dtype = match requested {
                DType::Q4K if row.is_multiple_of(32) => DType::Q4_1,
                DType::Q5K if row.is_multiple_of(32) => DType::Q5_1,
                DType::Q2K | DType::Q3K | DType::IQ4XS if row.is_multiple_of(32) => DType::IQ4NL,
                DType::Q6K if row.is_multiple_of(32) => DType::Q8_0,
                _ => DType::F16,
            };
            (dtype, true)
        };
        let packable = self.packed
            && role != TensorRole::PositionEmbedding
            && shape.len() == 2
            && shape[0].is_multiple_of(8);
        let dtype = match base {
            DType::Q4_0 | DType::Q4_1 if packable => DType::Q4Packed,
            DType::Q8_0 if packable => DType::Q8Packed,
            _ => base,
        };
        Storage {
            dtype,
            base,
            fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_names_and_ranks() {
        use TensorRole::*;
        let m = [256, 64];
        let cases = [
            ("model.embed_tokens.weight", Matrix, TokenEmbedding),
            ("model.decoder.embed_tokens.weight", Matrix, TokenEmbedding),
            ("transformer.wte.weight", Matrix, TokenEmbedding),
            ("transformer.wpe.weight", Matrix, PositionEmbedding),
            (
                "model.decoder.embed_positions.weight",
                Matrix,
                PositionEmbedding,
            ),
            ("lm_head.weight", Matrix, OutputHead),
            ("model.layers.0.self_attn.q_proj.weight", Matrix, Matrix),
            ("model.not_lm_head.weight", Matrix, Matrix),
        ];
        for (name, _, role) in cases {
            assert_eq!(TensorRole::of(name, &m), role, "{name}");
            assert_eq!(TensorRole::of(name, &[64]), Vector, "{name}");
        }
        assert_eq!(TensorRole::of("model.norm.weight", &[]), Vector);
    }

    #[test]
    fn flags_fallbacks_and_position_tables() {
        let policy = DTypePolicy {
            dtype: DType::Q4K,
            embed_dtype: Some(DType::Q6K),
            head_dtype: Some(DType::Q8_0),
            packed: false,
        };
        let s = |name: &str, shape: &[usize]| {
            let st = policy.storage(name, shape);
            (st.dtype, st.fallback)
        };
        assert_eq!(s("a.weight", &[8, 512]), (DType::Q4K, false));
        assert_eq!(s("a.weight", &[8, 64]), (DType::Q4_1, true));
        assert_eq!(s("a.weight", &[8, 48]), (DType::F16, true));
        assert_eq!(s("a.bias", &[48]), (DType::F32, false));
        assert_eq!(
            s("model.embed_tokens.weight", &[8, 256]),
            (DType::Q6K, false)
        );
        assert_eq!(
            s("model.embed_tokens.weight", &[8, 96]),
            (DType::Q8_0, true)
        );
        assert_eq!(s("lm_head.weight", &[8, 96]), (DType::Q8_0, false));
        assert_eq!(s("lm_head.weight", &[8, 20]), (DType::F16, true));
        assert_eq!(s("transformer.wpe.weight", &[8, 20]), (DType::F16, false));

        let floats = DTypePolicy {
            dtype: DType::Q4_0,
            embed_dtype: Some(DType::BF16),
            head_dtype: None,
            packed: false,
        };
        assert_eq!(
            floats.storage("transformer.wpe.weight", &[8, 20]).dtype,
            DType::BF16
        );
        assert_eq!(
            floats.storage("lm_head.weight", &[8, 64]).dtype,
            DType::Q4_0
        );
    }

    #[test]
    fn packed_storage_for_whole_row_groups_of_q4_and_q8_0() {
        let policy = DTypePolicy {
            embed_dtype: Some(DType::Q8_0),
            head_dtype: Some(DType::Q4K),
            packed: true,
            ..DTypePolicy::new(DType::Q4_1)
        };
        let s = |name: &str, shape: &[usize]| {
            let st = policy.storage(name, shape);
            (st.dtype, st.base, st.fallback)
        };
        assert_eq!(
            s("a.weight", &[16, 64]),
            (DType::Q4Packed, DType::Q4_1, false)
        );
        // Rows not in groups of eight, not 2-D, or not a packable type.
        assert_eq!(s("a.weight", &[12, 64]), (DType::Q4_1, DType::Q4_1, false));
        assert_eq!(
            s("a.weight", &[8, 2, 64]),
            (DType::Q4_1, DType::Q4_1, false)
        );
        assert_eq!(s("a.weight", &[8, 48]), (DType::F16, DType::F16, true));
        assert_eq!(s("a.bias", &[64]), (DType::F32, DType::F32, false));
        assert_eq!(
            s("model.embed_tokens.weight", &[64, 32]),
            (DType::Q8Packed, DType::Q8_0, false)
        );
        // A Q4_K head falls back to Q4_1 on 64-value rows, then packs.
        assert_eq!(
            s("lm_head.weight", &[64, 64]),
            (DType::Q4Packed, DType::Q4_1, true)
        );
        assert_eq!(
            s("lm_head.weight", &[64, 256]),
            (DType::Q4K, DType::Q4K, false)
        );
    }

    #[test]
    fn target_names() {
        assert_eq!(parse_target_dtype("Q4_K").unwrap(), DType::Q4K);
        assert_eq!(
            parse_target_dtype("q7_0").unwrap_err().to_string(),
            "invalid input: unknown dtype 'q7_0'; use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs"
        );
        let err = DTypePolicy {
            head_dtype: Some(DType::Q8K),
            ..DTypePolicy::new(DType::Q8_0)
        }
        .check()
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("head dtype: q8_k is not a conversion target"),
            "{err}"
        );
    }
}
