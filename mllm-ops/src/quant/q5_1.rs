//! Q5_1: 32 values per 24-byte block, `[d: f16][m: f16][qh: u32][qs: 16
//! bytes]` with the bit order of Q5_0; `x = d·q + m`.

use super::q5_0::{five_bits, pack_five_bits};
use super::{f16_at, to_f16};

/// Values per block.
pub(crate) const BLOCK_LEN: usize = 32;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: usize = 24;

/// The block's scale `d` and offset `m`.
#[inline(always)]
pub(crate) fn scale_min(b: &[u8; BLOCK_BYTES]) -> (f32, f32) {
    (f16_at(b, 0), f16_at(b, 2))
}

/// `out[i] = d · q[i] + m`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let (d, m) = scale_min(b);
    for (o, q) in out.iter_mut().zip(five_bits(b, 4)) {
        *o = d * q as f32 + m;
    }
}

/// `d = (max − min) / 31`, `m = min`, `q = min(31, ⌊(x − min) / d + 0.5⌋)`.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let (lo, hi) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let d = (hi - lo) / 31.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let (db, _) = to_f16(d);
    let (mb, _) = to_f16(lo);
    out[..2].copy_from_slice(&db);
    out[2..4].copy_from_slice(&mb);
    let q = x.map(|v| (((v - lo) * id + 0.5) as u8).min(31));
    pack_five_bits(&q, out, 4);
}
