//! Element conversion between F32, F16 and BF16 little-endian byte buffers.

use std::borrow::Cow;

use half::{bf16, f16};
use mllm_core::{DType, Error, Result};

/// A float element type stored little-endian.
trait Elem {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> f32;
    fn store(value: f32, out: &mut [u8]);
}

struct F32;
struct F16;
struct BF16;

impl Elem for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    #[inline(always)]
    fn store(v: f32, out: &mut [u8]) {
        out.copy_from_slice(&v.to_le_bytes());
    }
}

impl Elem for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f16::from_le_bytes([b[0], b[1]]).to_f32()
    }
    #[inline(always)]
    fn store(v: f32, out: &mut [u8]) {
        out.copy_from_slice(&f16::from_f32(v).to_le_bytes());
    }
}

impl Elem for BF16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        bf16::from_le_bytes([b[0], b[1]]).to_f32()
    }
    #[inline(always)]
    fn store(v: f32, out: &mut [u8]) {
        out.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
    }
}

/// Converts every element through f32 (exact for F16/BF16 sources; one
/// round-to-nearest-even when narrowing).
fn convert<S: Elem, D: Elem>(src: &[u8]) -> Vec<u8> {
    let n = src.len() / S::SIZE;
    let mut out = vec![0u8; n * D::SIZE];
    for (i, o) in src.chunks_exact(S::SIZE).zip(out.chunks_exact_mut(D::SIZE)) {
        D::store(S::load(i), o);
    }
    out
}

/// True for the dtypes the converter reads and writes.
pub fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Converts little-endian `from` elements to little-endian `to` elements.
///
/// Equal dtypes borrow the input unchanged. Narrowing rounds to nearest even
/// (as `half::f16::from_f32` and `half::bf16::from_f32` do); widening is exact.
pub fn cast(src: &[u8], from: DType, to: DType) -> Result<Cow<'_, [u8]>> {
    if from == to && is_float(from) {
        return Ok(Cow::Borrowed(src));
    }
    let size = from.block_bytes();
    if !is_float(from) || !is_float(to) || !src.len().is_multiple_of(size) {
        return Err(Error::UnsupportedDType(format!(
            "cannot convert {} bytes of {from} to {to}",
            src.len()
        )));
    }
    let out = match (from, to) {
        (DType::F32, DType::F16) => convert::<F32, F16>(src),
        (DType::F32, DType::BF16) => convert::<F32, BF16>(src),
        (DType::F16, DType::F32) => convert::<F16, F32>(src),
        (DType::F16, DType::BF16) => convert::<F16, BF16>(src),
        (DType::BF16, DType::F32) => convert::<BF16, F32>(src),
        (DType::BF16, DType::F16) => convert::<BF16, F16>(src),
        _ => unreachable!("equal float dtypes returned above"),
    };
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn narrowing_rounds_like_half() {
        let values = [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1e-3,
            65504.0,
            70000.0,
            1e-8,
            -2.71,
            f32::INFINITY,
        ];
        let src = f32_bytes(&values);
        let h = cast(&src, DType::F32, DType::F16).unwrap();
        let b = cast(&src, DType::F32, DType::BF16).unwrap();
        for (i, v) in values.iter().enumerate() {
            assert_eq!(h[2 * i..2 * i + 2], f16::from_f32(*v).to_le_bytes());
            assert_eq!(b[2 * i..2 * i + 2], bf16::from_f32(*v).to_le_bytes());
        }
    }

    #[test]
    fn widening_is_exact_and_same_dtype_borrows() {
        let halfs: Vec<u8> = [1.5f32, -2.25, 1e-5]
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let wide = cast(&halfs, DType::BF16, DType::F32).unwrap();
        let back = cast(&wide, DType::F32, DType::BF16).unwrap();
        assert_eq!(&back[..], &halfs[..]);
        assert!(matches!(
            cast(&halfs, DType::BF16, DType::BF16).unwrap(),
            Cow::Borrowed(_)
        ));
        assert!(cast(&halfs, DType::F32, DType::Q4_0).is_err());
        assert!(cast(&halfs[..3], DType::F16, DType::F32).is_err());
    }
}
