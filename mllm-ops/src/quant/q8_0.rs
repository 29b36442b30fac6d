//! Q8_0: 32 values per 34-byte block, `[d: f16][qs: 32 × i8]`, `x = d·q`.

use super::{f16_at, to_f16};

/// Values per block.
pub(crate) const BLOCK_LEN: usize = 32;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: usize = 34;

/// The block's scale `d`.
#[inline(always)]
pub(crate) fn scale(b: &[u8; BLOCK_BYTES]) -> f32 {
    f16_at(b, 0)
}

/// The block's 32 signed values.
#[inline(always)]
pub(crate) fn quants(b: &[u8; BLOCK_BYTES]) -> [i8; BLOCK_LEN] {
    std::array::from_fn(|i| b[2 + i] as i8)
}

/// `out[i] = q[i] · d`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = scale(b);
    for (o, q) in out.iter_mut().zip(quants(b)) {
        *o = q as f32 * d;
    }
}

/// `d = amax / 127`, `q = round(x / d)` (computed as `x · (1 / d)`).
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let (bytes, _) = to_f16(d);
    out[..2].copy_from_slice(&bytes);
    for (o, &v) in out[2..].iter_mut().zip(x) {
        *o = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
    }
}
