//! ggml's block-quantized weight formats with mllm's dtype codes: byte
//! layouts, quantizers and dequantizers.
//!
//! Every format stores a row as consecutive blocks; all fields are
//! little-endian and `f16` is IEEE half precision.
//!
//! | dtype | values | bytes | layout | value |
//! | --- | --- | --- | --- | --- |
//! | [`DType::Q8_0`] | 32 | 34 | `d: f16`, `qs: [i8; 32]` | `d·q` |
//! | [`DType::Q4_0`] | 32 | 18 | `d: f16`, `qs: [u8; 16]` | `d·(q − 8)` |
//! | [`DType::Q4_1`] | 32 | 20 | `d: f16`, `m: f16`, `qs: [u8; 16]` | `d·q + m` |
//! | [`DType::Q5_0`] | 32 | 22 | `d: f16`, `qh: u32`, `qs: [u8; 16]` | `d·(q − 16)` |
//! | [`DType::Q5_1`] | 32 | 24 | `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]` | `d·q + m` |
//! | [`DType::Q4K`] | 256 | 144 | `d, dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]` | `d·sc·q − dmin·m` |
//! | [`DType::Q5K`] | 256 | 176 | `d, dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]`, `qs: [u8; 128]` | `d·sc·q − dmin·m` |
//! | [`DType::Q2K`] | 256 | 84 | `scales: [u8; 16]`, `qs: [u8; 64]`, `d, dmin: f16` | `d·sc·q − dmin·m` |
//! | [`DType::Q3K`] | 256 | 110 | `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16` | `d·(sc − 32)·(q − 4)` |
//! | [`DType::IQ4NL`] | 32 | 18 | `d: f16`, `qs: [u8; 16]` | `d·grid[q]` |
//! | [`DType::IQ4XS`] | 256 | 136 | `d: f16`, `scales_h: u16`, `scales_l: [u8; 4]`, `qs: [u8; 128]` | `d·(ls − 32)·grid[q]` |
//! | [`DType::Q6K`] | 256 | 210 | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16` | `d·sc·(q − 32)` |
//!
//! The nibble and bit orders are described in each format's module. The
//! dequantizers compute exactly what ggml's reference does (the f16 scale
//! widened to f32, K-quant sub-block scales as the f32 product `d·sc`, then
//! one multiply and at most one add per value), so results are bit-exact.

pub(crate) mod fit;
pub(crate) mod iq4_nl;
pub(crate) mod iq4_xs;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;

use half::f16;
use mllm_core::{DType, Error, Result};

/// One of the block-quantized formats the CPU kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32 values: f16 scale and 32 signed bytes.
    Q8_0,
    /// 32 values: f16 scale and 32 nibbles offset by 8.
    Q4_0,
    /// 32 values: f16 scale, f16 minimum and 32 nibbles.
    Q4_1,
    /// 32 values: f16 scale and 32 five-bit values offset by 16.
    Q5_0,
    /// 32 values: f16 scale, f16 minimum and 32 five-bit values.
    Q5_1,
    /// 256 values: eight sub-blocks with 6-bit scales and minimums, nibbles.
    Q4K,
    /// 256 values: Q4_K's sub-blocks with five-bit values.
    Q5K,
    /// 256 values: sixteen sub-blocks with 8-bit scales, 6-bit values.
    Q6K,
    /// 256 values: sixteen sub-blocks with 4-bit scales and minimums,
    /// 2-bit values.
    Q2K,
    /// 256 values: sixteen sub-blocks with 6-bit scales, 3-bit values.
    Q3K,
    /// 32 values: f16 scale and 32 nibbles indexing a non-linear grid.
    IQ4NL,
    /// 256 values: eight sub-blocks with 6-bit scales, IQ4_NL's grid.
    IQ4XS,
}

impl QuantType {
    /// Every supported format.
    pub const ALL: [QuantType; 12] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::IQ4NL,
        QuantType::IQ4XS,
    ];

    /// The format stored with `dtype`, or `None` when it is not one of these.
    pub fn from_dtype(dtype: DType) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|q| q.dtype() == dtype)
    }

    /// The mllm dtype of this format.
    pub fn dtype(self) -> DType {
        match self {
            QuantType::Q8_0 => DType::Q8_0,
            QuantType::Q4_0 => DType::Q4_0,
            QuantType::Q4_1 => DType::Q4_1,
            QuantType::Q5_0 => DType::Q5_0,
            QuantType::Q5_1 => DType::Q5_1,
            QuantType::Q4K => DType::Q4K,
            QuantType::Q5K => DType::Q5K,
            QuantType::Q6K => DType::Q6K,
            QuantType::Q2K => DType::Q2K,
            QuantType::Q3K => DType::Q3K,
            QuantType::IQ4NL => DType::IQ4NL,
            QuantType::IQ4XS => DType::IQ4XS,
        }
    }

    /// Values per block (32 or 256).
    pub fn block_len(self) -> usize {
        self.dtype().block_len()
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.dtype().block_bytes()
    }

    /// Bytes of a row of `n` values, or an error when `n` is not a whole
    /// number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        self.dtype().bytes_for(n)
    }

    /// Dequantizes whole blocks; `out.len()` must be
    /// `blocks.len() / block_bytes * block_len` (checked by the callers).
    pub(crate) fn dequantize_blocks(self, blocks: &[u8], out: &mut [f32]) {
        debug_assert_eq!(
            blocks.len() / self.block_bytes() * self.block_len(),
            out.len()
        );
        match self {
            QuantType::Q8_0 => each_block(blocks, out, q8_0::dequantize_block),
            QuantType::Q4_0 => each_block(blocks, out, q4_0::dequantize_block),
            QuantType::Q4_1 => each_block(blocks, out, q4_1::dequantize_block),
            QuantType::Q5_0 => each_block(blocks, out, q5_0::dequantize_block),
            QuantType::Q5_1 => each_block(blocks, out, q5_1::dequantize_block),
            QuantType::Q5K => each_block(blocks, out, q5_k::dequantize_block),
            QuantType::Q4K => each_block(blocks, out, q4_k::dequantize_block),
            QuantType::Q6K => each_block(blocks, out, q6_k::dequantize_block),
            QuantType::Q2K => each_block(blocks, out, q2_k::dequantize_block),
            QuantType::Q3K => each_block(blocks, out, q3_k::dequantize_block),
            QuantType::IQ4NL => each_block(blocks, out, iq4_nl::dequantize_block),
            QuantType::IQ4XS => each_block(blocks, out, iq4_xs::dequantize_block),
        }
    }

    /// Quantizes whole blocks of checked (finite, f16-range) values.
    fn quantize_blocks(self, x: &[f32], out: &mut [u8]) {
        match self {
            QuantType::Q8_0 => each_block_mut(x, out, q8_0::quantize_block),
            QuantType::Q4_0 => each_block_mut(x, out, q4_0::quantize_block),
            QuantType::Q4_1 => each_block_mut(x, out, q4_1::quantize_block),
            QuantType::Q5_0 => each_block_mut(x, out, q5_0::quantize_block),
            QuantType::Q5_1 => each_block_mut(x, out, q5_1::quantize_block),
            QuantType::Q5K => each_block_mut(x, out, q5_k::quantize_block),
            QuantType::Q4K => each_block_mut(x, out, q4_k::quantize_block),
            QuantType::Q6K => each_block_mut(x, out, q6_k::quantize_block),
            QuantType::Q2K => each_block_mut(x, out, q2_k::quantize_block),
            QuantType::Q3K => each_block_mut(x, out, q3_k::quantize_block),
            QuantType::IQ4NL => each_block_mut(x, out, iq4_nl::quantize_block),
            QuantType::IQ4XS => each_block_mut(x, out, iq4_xs::quantize_block),
        }
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.dtype().fmt(f)
    }
}

/// Applies `f` to every (block bytes, values) pair.
fn each_block<const B: usize, const N: usize>(
    blocks: &[u8],
    out: &mut [f32],
    f: fn(&[u8; B], &mut [f32; N]),
) {
    let (blocks, _) = blocks.as_chunks::<B>();
    let (out, _) = out.as_chunks_mut::<N>();
    for (b, o) in blocks.iter().zip(out) {
        f(b, o);
    }
}

/// Applies `f` to every (values, block bytes) pair.
fn each_block_mut<const N: usize, const B: usize>(
    x: &[f32],
    out: &mut [u8],
    f: fn(&[f32; N], &mut [u8; B]),
) {
    let (x, _) = x.as_chunks::<N>();
    let (out, _) = out.as_chunks_mut::<B>();
    for (v, b) in x.iter().zip(out) {
        f(v, b);
    }
}

/// The format for `dtype`, or [`Error::UnsupportedDType`] naming `what`.
fn quant_type(dtype: DType, what: &str) -> Result<QuantType> {
    QuantType::from_dtype(dtype).ok_or_else(|| {
        Error::UnsupportedDType(format!(
            "{what}: dtype {dtype} is not a supported block-quantized format \
             (supported: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)"
        ))
    })
}

/// Quantizes `x` (one or more rows laid end to end) into blocks of `dtype`.
///
/// `x.len()` must be a multiple of the block length (32, or 256 for the
/// K-quants), so every row of a matrix must be too; each value must be
/// finite and within the f16 range (`|x| ≤ 65504`), since scales are f16.
///
/// The quantizers round to nearest:
/// * Q8_0: `d = amax / 127`, `q = round(x / d)`;
/// * Q4_0: `d = v / −8` with `v` the value of largest magnitude,
///   `q = min(15, ⌊x / d + 8.5⌋)`;
/// * Q4_1: `d = (max − min) / 15`, `m = min`, `q = min(15, ⌊(x − m) / d + 0.5⌋)`;
/// * Q5_0: `d = v / −16`, `q = min(31, ⌊x / d + 16.5⌋)`;
/// * Q5_1: `d = (max − min) / 31`, `m = min`, `q = min(31, ⌊(x − m) / d + 0.5⌋)`;
/// * Q4_K: per sub-block of 32 a least-squares search over candidate scales
///   for `x ≈ s·q − m` (`q ∈ 0..=15`, `m ≥ 0`), then 6-bit sub-block scales and
///   minimums relative to the super-block's `d = max s / 63` and
///   `dmin = max m / 63`, and the values re-quantized with those;
/// * Q5_K: as Q4_K with `q ∈ 0..=31`;
/// * Q2_K: as Q4_K with sub-blocks of 16, `q ∈ 0..=3` and 4-bit scales and
///   minimums relative to `d = max s / 15`, `dmin = max m / 15`;
/// * Q3_K: per sub-block of 16 a least-squares search for `x ≈ s·q`
///   (`q ∈ −4..=3`), 6-bit signed scales relative to `d = max |s| / 31`;
/// * IQ4_NL: a least-squares search for `x ≈ d·g` with `g` on the grid,
///   each value the nearest grid point;
/// * IQ4_XS: that search per sub-block of 32, 6-bit signed scales relative
///   to `d = max |s| / 31`, values re-quantized with the stored scales;
/// * Q6_K: per sub-block of 16 a least-squares search for `x ≈ s·q`
///   (`q ∈ −32..=31`), then 8-bit signed scales relative to `d = max |s| / 127`
///   and the values re-quantized with those.
pub fn quantize(dtype: DType, x: &[f32]) -> Result<Vec<u8>> {
    let qt = quant_type(dtype, "quantize")?;
    let len = qt.row_bytes(x.len())?;
    let limit = f16::MAX.to_f32();
    if let Some(i) = x.iter().position(|v| v.is_nan() || v.abs() > limit) {
        return Err(Error::InvalidInput(format!(
            "quantize to {dtype}: value {} at index {i} is not finite or outside the f16 range",
            x[i]
        )));
    }
    let mut out = vec![0u8; len];
    qt.quantize_blocks(x, &mut out);
    Ok(out)
}

/// Dequantizes blocks of `dtype` into `out`, which must hold exactly the
/// number of values the blocks encode (`bytes.len() / block_bytes ·
/// block_len`); otherwise an [`Error::SizeMismatch`].
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let qt = quant_type(dtype, "dequantize")?;
    let expected = qt.row_bytes(out.len())?;
    if bytes.len() != expected {
        return Err(Error::SizeMismatch {
            name: "dequantize input".into(),
            shape: vec![out.len()],
            dtype: dtype.to_string(),
            len: bytes.len() as u64,
            expected: expected as u64,
        });
    }
    qt.dequantize_blocks(bytes, out);
    Ok(())
}

/// Reads the little-endian f16 at `b[0..2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Rounds `v` to f16 and returns its little-endian bytes and its f32 value.
#[inline]
pub(crate) fn to_f16(v: f32) -> ([u8; 2], f32) {
    let h = f16::from_f32(v);
    (h.to_le_bytes(), h.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_round_trip() {
        for q in QuantType::ALL {
            assert_eq!(QuantType::from_dtype(q.dtype()), Some(q));
            assert_eq!(q.to_string(), q.dtype().name());
        }
        assert_eq!(QuantType::from_dtype(DType::F32), None);
        assert_eq!(QuantType::from_dtype(DType::Q8K), None);
        assert_eq!(QuantType::from_dtype(DType::Q8Packed), None);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let err = quantize(DType::F16, &[0.0; 32]).unwrap_err();
        assert!(matches!(err, Error::UnsupportedDType(_)), "{err}");
        assert!(err.to_string().contains("f16"), "{err}");
        let err = quantize(DType::Q4K, &[0.0; 32]).unwrap_err();
        assert!(err.to_string().contains("256"), "{err}");
        let err = quantize(DType::Q8_0, &[0.0, f32::NAN].repeat(16)).unwrap_err();
        assert!(err.to_string().contains("index 1"), "{err}");
        assert!(quantize(DType::Q8_0, &[1e6; 32]).is_err());
        let mut out = [0.0; 32];
        let err = dequantize(DType::Q8_0, &[0; 33], &mut out).unwrap_err();
        assert!(matches!(err, Error::SizeMismatch { .. }), "{err}");
        let err = dequantize(DType::Q6K, &[0; 210], &mut out).unwrap_err();
        assert!(matches!(err, Error::UnsupportedDType(_)), "{err}");
        let err = dequantize(DType::BF16, &[0; 64], &mut out).unwrap_err();
        assert!(matches!(err, Error::UnsupportedDType(_)), "{err}");
    }

    #[test]
    fn empty_input() {
        for q in QuantType::ALL {
            assert!(quantize(q.dtype(), &[]).unwrap().is_empty());
            dequantize(q.dtype(), &[], &mut []).unwrap();
        }
    }

    #[test]
    fn zeros_and_constants_round_trip() {
        for q in QuantType::ALL {
            let n = 2 * q.block_len();
            for c in [0.0f32, 0.5, -3.0] {
                let x = vec![c; n];
                let bytes = quantize(q.dtype(), &x).unwrap();
                assert_eq!(bytes.len(), 2 * q.block_bytes());
                let mut y = vec![f32::NAN; n];
                dequantize(q.dtype(), &bytes, &mut y).unwrap();
                for &v in &y {
                    assert!((v - c).abs() <= 0.02 * c.abs(), "{q}: {v} vs {c}");
                }
            }
        }
    }
}
