//! Q4_0: 32 values per 18-byte block, `[d: f16][qs: 16 bytes]`; byte `j`
//! holds value `j` in its low nibble and value `j + 16` in its high nibble;
//! `x = d·(q − 8)`.

use super::{f16_at, to_f16};

/// Values per block.
pub(crate) const BLOCK_LEN: usize = 32;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: usize = 18;

/// The block's scale `d`.
#[inline(always)]
pub(crate) fn scale(b: &[u8; BLOCK_BYTES]) -> f32 {
    f16_at(b, 0)
}

/// The block's 32 unsigned nibbles (0..=15) in value order.
#[inline(always)]
pub(crate) fn nibbles(b: &[u8; BLOCK_BYTES]) -> [u8; BLOCK_LEN] {
    std::array::from_fn(|i| {
        let byte = b[2 + i % 16];
        if i < 16 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    })
}

/// `out[i] = d · (q[i] − 8)`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = scale(b);
    for (o, q) in out.iter_mut().zip(nibbles(b)) {
        *o = d * (q as i32 - 8) as f32;
    }
}

/// `d = v / −8` with `v` the value of largest magnitude (so `v` maps to
/// nibble 0), `q = min(15, ⌊x / d + 8.5⌋)`.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let v = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = v / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let (bytes, _) = to_f16(d);
    out[..2].copy_from_slice(&bytes);
    let q = |v: f32| ((v * id + 8.5) as u8).min(15);
    for j in 0..16 {
        out[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}
