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

/// Checks that `dtype` is F32, F16 or BF16 and `len` bytes are whole elements.
fn check_float(dtype: DType, len: usize) -> Result<()> {
    if !is_float(dtype) || !len.is_multiple_of(dtype.block_bytes()) {
        return Err(Error::UnsupportedDType(format!(
            "{len} bytes are not {dtype} elements"
        )));
    }
    Ok(())
}

/// Reads little-endian F32, F16 or BF16 elements as f32 values (exactly).
pub(crate) fn load_f32(src: &[u8], from: DType) -> Result<Vec<f32>> {
    fn load<S: Elem>(src: &[u8]) -> Vec<f32> {
        src.chunks_exact(S::SIZE).map(S::load).collect()
    }
    check_float(from, src.len())?;
    Ok(match from {
        DType::F32 => load::<F32>(src),
        DType::F16 => load::<F16>(src),
        _ => load::<BF16>(src),
    })
}

/// Writes f32 values as little-endian F32, F16 or BF16 elements (rounding
/// to nearest even when narrowing, as [`cast`] does).
pub(crate) fn store_f32(values: &[f32], to: DType) -> Result<Vec<u8>> {
    fn store<D: Elem>(values: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * D::SIZE];
        for (v, o) in values.iter().zip(out.chunks_exact_mut(D::SIZE)) {
            D::store(*v, o);
        }
        out
    }
    check_float(to, 0)?;
    Ok(match to {
        DType::F32 => store::<F32>(values),
        DType::F16 => store::<F16>(values),
        _ => store::<BF16>(values),
    })
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

    #[test]
    fn load_and_store_match_cast() {
        let values = [1.5f32, -2.25, 1e-5, 70000.0, 0.1];
        let src = f32_bytes(&values);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let stored = store_f32(&values, dtype).unwrap();
            assert_eq!(stored, cast(&src, DType::F32, dtype).unwrap().as_ref());
            let wide = cast(&stored, dtype, DType::F32).unwrap();
            let loaded = load_f32(&stored, dtype).unwrap();
            assert_eq!(f32_bytes(&loaded), wide.as_ref());
        }
        assert!(load_f32(&src[..3], DType::F32).is_err());
        assert!(load_f32(&src, DType::Q8_0).is_err());
        assert!(store_f32(&values, DType::I8).is_err());
    }
}
