//! Re-encoding one tensor's bytes from its source dtype into its storage
//! dtype: float casts, quantization and dequantization.

use std::borrow::Cow;

use half::f16;
use mllm_core::{DType, Error, Result};
use mllm_ops::cpu::kernels::{PackedQ4, PackedQ8, QuantMatrix};
use mllm_ops::quant::{dequantize, quantize, QuantType};
use rayon::prelude::*;

use crate::cast::{cast, is_float, load_f32, store_f32};
use crate::policy::Storage;

/// Values quantized per parallel task (rounded to whole rows).
const CHUNK_VALUES: usize = 1 << 16;

/// Decodes `bytes` of `from` (f32, f16, bf16 or one of the block-quantized
/// formats of [`QuantType`]) into f32 values.
pub(crate) fn to_f32(bytes: &[u8], from: DType) -> Result<Vec<f32>> {
    if is_float(from) {
        return load_f32(bytes, from);
    }
    let qt = QuantType::from_dtype(from).ok_or_else(|| {
        Error::UnsupportedDType(format!(
            "dtype {from} cannot be read; the converter reads f32, f16, bf16, q8_0, q4_0, q4_1, \
             q4_k and q6_k"
        ))
    })?;
    let mut out = vec![0.0f32; bytes.len() / qt.block_bytes() * qt.block_len()];
    dequantize(from, bytes, &mut out)?;
    Ok(out)
}

/// Re-encodes `bytes` of `from` for a tensor of `shape` as `storage` says:
/// [`encode`] into its block type, then, for a packed storage, rearranged
/// into the packed layout. Bytes already in the storage's type are
/// borrowed unchanged.
pub(crate) fn encode_stored<'a>(
    bytes: &'a [u8],
    from: DType,
    storage: &Storage,
    shape: &[usize],
) -> Result<Cow<'a, [u8]>> {
    let row_len = shape.last().copied().unwrap_or(1);
    if from == storage.dtype || !storage.dtype.is_packed() {
        return encode(bytes, from, storage.dtype, row_len);
    }
    let base = encode(bytes, from, storage.base, row_len)?;
    let rows = shape.first().copied().unwrap_or(1);
    let qt = QuantType::from_dtype(storage.base)
        .ok_or_else(|| Error::UnsupportedDType(format!("{} cannot be packed", storage.base)))?;
    let m = QuantMatrix::new(qt, &base, rows, row_len)?;
    Ok(Cow::Owned(match storage.dtype {
        DType::Q8Packed => PackedQ8::pack(&m)?.bytes().to_vec(),
        _ => PackedQ4::pack(&m)?.bytes().to_vec(),
    }))
}

/// The f32 values of a packed tensor with rows of `row_len` values.
fn unpack(bytes: &[u8], from: DType, row_len: usize) -> Result<Vec<f32>> {
    // One block of a packed type covers eight rows of 32 values.
    let group_bytes = row_len / 32 * from.block_bytes();
    if row_len == 0 || !row_len.is_multiple_of(32) || !bytes.len().is_multiple_of(group_bytes) {
        return Err(Error::InvalidInput(format!(
            "{} bytes of {from} do not hold whole groups of rows of {row_len} values",
            bytes.len()
        )));
    }
    let mut out = vec![0.0f32; bytes.len() / group_bytes * 8 * row_len];
    for (group, rows) in bytes
        .chunks_exact(group_bytes)
        .zip(out.chunks_exact_mut(8 * row_len))
    {
        for (r, row) in rows.chunks_exact_mut(row_len).enumerate() {
            match from {
                DType::Q8Packed => PackedQ8::unpack_row(group, r, row),
                _ => PackedQ4::unpack_row(group, r, row),
            }
        }
    }
    Ok(out)
}

/// Re-encodes `bytes` of `from` as `to`, rows of `row_len` values each.
///
/// Equal dtypes borrow the input unchanged; float to float is [`cast`];
/// anything else goes through f32 and, for a quantized `to`, is quantized
/// with [`mllm_ops::quant::quantize`] in parallel over whole rows (rows are
/// independent, so the bytes do not depend on the split). A value that is
/// not finite or beyond the f16 range is an error naming its row and column.
pub(crate) fn encode(
    bytes: &[u8],
    from: DType,
    to: DType,
    row_len: usize,
) -> Result<Cow<'_, [u8]>> {
    if from == to {
        return Ok(Cow::Borrowed(bytes));
    }
    if is_float(from) && is_float(to) {
        return cast(bytes, from, to);
    }
    let values = if from.is_packed() {
        unpack(bytes, from, row_len)?
    } else {
        to_f32(bytes, from)?
    };
    if is_float(to) {
        return store_f32(&values, to).map(Cow::Owned);
    }
    let limit = f16::MAX.to_f32();
    if let Some(i) = values.iter().position(|v| v.is_nan() || v.abs() > limit) {
        let (row, col) = (i / row_len.max(1), i % row_len.max(1));
        return Err(Error::InvalidInput(format!(
            "value {} at row {row}, column {col} cannot be stored as {to}: it is not finite or \
             outside the f16 range of the block scales",
            values[i]
        )));
    }
    if row_len == 0 || values.is_empty() {
        return quantize(to, &values).map(Cow::Owned);
    }
    let chunk = CHUNK_VALUES.div_ceil(row_len) * row_len;
    let parts = values
        .par_chunks(chunk)
        .map(|part| quantize(to, part))
        .collect::<Result<Vec<_>>>()?;
    Ok(Cow::Owned(parts.concat()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn quantizing_in_chunks_equals_one_call() {
        // 3 chunks of rows of 96 values (not a divisor of the chunk size).
        let values: Vec<f32> = (0..3 * CHUNK_VALUES)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let bytes = f32_bytes(&values);
        for to in [DType::Q8_0, DType::Q4_1] {
            let got = encode(&bytes, DType::F32, to, 96).unwrap();
            assert_eq!(got.as_ref(), quantize(to, &values).unwrap(), "{to}");
        }
        let got = encode(&bytes, DType::F32, DType::Q6K, 256).unwrap();
        assert_eq!(got.as_ref(), quantize(DType::Q6K, &values).unwrap());
    }

    #[test]
    fn dequantizes_and_copies_same_types() {
        let values: Vec<f32> = (0..64).map(|i| i as f32 / 8.0 - 4.0).collect();
        let q = quantize(DType::Q8_0, &values).unwrap();
        assert!(matches!(
            encode(&q, DType::Q8_0, DType::Q8_0, 64).unwrap(),
            Cow::Borrowed(_)
        ));
        let mut want = vec![0.0; 64];
        dequantize(DType::Q8_0, &q, &mut want).unwrap();
        assert_eq!(to_f32(&q, DType::Q8_0).unwrap(), want);
        let wide = encode(&q, DType::Q8_0, DType::F32, 64).unwrap();
        assert_eq!(wide.as_ref(), f32_bytes(&want));
        let q4 = encode(&q, DType::Q8_0, DType::Q4_0, 64).unwrap();
        assert_eq!(q4.as_ref(), quantize(DType::Q4_0, &want).unwrap());
        let err = to_f32(&[0; 4], DType::I32).unwrap_err();
        assert!(err.to_string().contains("i32 cannot be read"), "{err}");
    }

    #[test]
    fn bad_values_are_errors() {
        let mut values = vec![0.5f32; 64];
        values[40] = f32::INFINITY;
        let err = encode(&f32_bytes(&values), DType::F32, DType::Q4_0, 32).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid input: value inf at row 1, column 8 cannot be stored as q4_0: it is not \
             finite or outside the f16 range of the block scales"
        );
        // Rows not made of whole blocks.
        assert!(encode(&f32_bytes(&values), DType::F32, DType::Q4K, 64).is_err());
    }
}
