//! Q5_K: 256 values per 176-byte super-block:
//! `[d: f16][dmin: f16][scales: 12 bytes][qh: 32 bytes][qs: 128 bytes]`.
//!
//! The header and sub-blocks are Q4_K's (eight sub-blocks of 32 values with
//! 6-bit scales and minimums packed the same way; `x = d·sc·q − dmin·m`),
//! with five-bit values: the nibbles sit in `qs` as in Q4_K, and bit `j` of
//! `qh[l]` is the fifth bit of value `32j + l`.

use super::q4_k::{fit_header, header_scales, requantize};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 176;

/// The per-sub-block multipliers `d·sc[j]` and offsets `dmin·m[j]`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> ([f32; 8], [f32; 8]) {
    header_scales(b)
}

/// The 32 bytes of fifth bits.
#[inline(always)]
pub(crate) fn qh(b: &[u8; BLOCK_BYTES]) -> &[u8] {
    &b[16..48]
}

/// The 128 bytes of nibbles.
#[inline(always)]
pub(crate) fn qs(b: &[u8; BLOCK_BYTES]) -> &[u8] {
    &b[48..]
}

/// `out[i] = (d·sc[j]) · q[i] − dmin·m[j]` for `i` in sub-block `j`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let (dl, ml) = sub_scales(b);
    let high = qh(b);
    for (g, (group, vals)) in qs(b)
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let (lo, hi) = vals.split_at_mut(32);
        for (l, &q) in group.iter().enumerate() {
            let h = high[l] >> (2 * g);
            let q_lo = (q & 0x0F) | ((h & 1) << 4);
            let q_hi = (q >> 4) | ((h & 2) << 3);
            lo[l] = dl[2 * g] * q_lo as f32 - ml[2 * g];
            hi[l] = dl[2 * g + 1] * q_hi as f32 - ml[2 * g + 1];
        }
    }
}

/// Q4_K's header fit with values in `0..=31`, then the values re-quantized
/// with the stored (rounded) parameters.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let (header, dl, ml) = fit_header(x, 31);
    out[..16].copy_from_slice(&header);
    out[16..].fill(0);
    for g in 0..4 {
        for l in 0..32 {
            let lo = requantize(x[64 * g + l], dl[2 * g], ml[2 * g], 31);
            let hi = requantize(x[64 * g + 32 + l], dl[2 * g + 1], ml[2 * g + 1], 31);
            out[16 + l] |= ((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1));
            out[48 + 32 * g + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        }
    }
}
