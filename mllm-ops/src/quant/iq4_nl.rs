//! IQ4_NL: 32 values per 18-byte block, `[d: f16][qs: 16 bytes]` with the
//! nibble order of Q4_0; `x = d·grid[q]` with the non-linear 16-value
//! [`GRID`].

use super::fit::{fit_grid, nearest};
use super::{f16_at, to_f16};

/// Values per block.
pub(crate) const BLOCK_LEN: usize = 32;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: usize = 18;

/// The values a nibble stands for (ggml's `kvalues_iq4nl`).
pub(crate) const GRID: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// [`GRID`] as f32, for the quantizers.
pub(crate) fn grid_f32() -> [f32; 16] {
    GRID.map(f32::from)
}

/// The block's scale `d`.
#[inline(always)]
pub(crate) fn scale(b: &[u8; BLOCK_BYTES]) -> f32 {
    f16_at(b, 0)
}

/// `out[i] = dl · grid[q[i]]` for 32 values whose nibbles are the 16 bytes
/// `qs` (value `j` low, value `j + 16` high).
#[inline(always)]
pub(crate) fn decode_32(qs: &[u8], dl: f32, out: &mut [f32]) {
    for j in 0..16 {
        out[j] = dl * GRID[(qs[j] & 0x0F) as usize] as f32;
        out[j + 16] = dl * GRID[(qs[j] >> 4) as usize] as f32;
    }
}

/// Nibbles of the 32 values `x` on the grid scaled by `dl`, packed as
/// [`decode_32`] reads them.
pub(crate) fn encode_32(x: &[f32], dl: f32, qs: &mut [u8]) {
    let grid = grid_f32();
    let q = |v: f32| {
        if dl == 0.0 {
            nearest(&grid, 0.0) as u8
        } else {
            nearest(&grid, v / dl) as u8
        }
    };
    for j in 0..16 {
        qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// `out[i] = d · grid[q[i]]`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    decode_32(&b[2..], scale(b), out);
}

/// `d` from [`fit_grid`] stored as f16, each value the nearest grid point
/// of `x / d` with the stored `d`.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let (db, d) = to_f16(fit_grid(x, &grid_f32()));
    out[..2].copy_from_slice(&db);
    encode_32(x, d, &mut out[2..]);
}
