//! IQ4_XS: 256 values per 136-byte super-block:
//! `[d: f16][scales_h: u16][scales_l: 4 bytes][qs: 128 bytes]`.
//!
//! Eight sub-blocks of 32 values each have a 6-bit scale `ls` stored with
//! an offset of 32 (low four bits: nibble `j % 2` of `scales_l[j / 2]`; top
//! two: bits `2j..2j + 2` of the little-endian `scales_h`);
//! `x = d·(ls − 32)·grid[q]` with IQ4_NL's grid, each sub-block's 16 bytes
//! of `qs` holding its nibbles as IQ4_NL does.

use super::fit::fit_grid;
use super::iq4_nl::{decode_32, encode_32, grid_f32};
use super::{f16_at, to_f16};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 136;

/// The per-sub-block multipliers `d·(ls[j] − 32)`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> [f32; 8] {
    let d = f16_at(b, 0);
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|j| {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
        let ls = low as i32 | ((((high >> (2 * j)) & 3) as i32) << 4);
        d * (ls - 32) as f32
    })
}

/// The 16 bytes of nibbles of sub-block `j`.
#[inline(always)]
pub(crate) fn qs(b: &[u8; BLOCK_BYTES], j: usize) -> &[u8] {
    &b[8 + 16 * j..24 + 16 * j]
}

/// `out[i] = (d·(ls[j] − 32)) · grid[q[i]]` for `i` in sub-block `j`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let dl = sub_scales(b);
    for (j, vals) in out.chunks_exact_mut(32).enumerate() {
        decode_32(qs(b, j), dl[j], vals);
    }
}

/// Fits each sub-block with [`fit_grid`], stores `d = max |s| / 31` as f16,
/// rounds the sub-block scales to `−32..=31` relative to it, and
/// re-quantizes the values with the stored scales.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let grid = grid_f32();
    let s: [f32; 8] = std::array::from_fn(|j| fit_grid(&x[32 * j..32 * j + 32], &grid));
    let amax = s.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let (db, d) = to_f16(amax / 31.0);
    out.fill(0);
    out[..2].copy_from_slice(&db);
    let mut high = 0u16;
    for (j, &v) in s.iter().enumerate() {
        let k = if d > 0.0 {
            (v / d).round().clamp(-32.0, 31.0) as i32
        } else {
            0
        };
        let ls = (k + 32) as u16;
        out[4 + j / 2] |= ((ls & 0x0F) as u8) << (4 * (j % 2));
        high |= (ls >> 4) << (2 * j);
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
    let dl = sub_scales(out);
    for j in 0..8 {
        encode_32(
            &x[32 * j..32 * j + 32],
            dl[j],
            &mut out[8 + 16 * j..24 + 16 * j],
        );
    }
}
