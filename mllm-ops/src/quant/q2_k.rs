//! Q2_K: 256 values per 84-byte super-block:
//! `[scales: 16 bytes][qs: 64 bytes][d: f16][dmin: f16]`.
//!
//! Sixteen sub-blocks of 16 values each have a 4-bit scale `sc` (low
//! nibble of `scales[j]`) and a 4-bit minimum `m` (high nibble);
//! `x = d·sc·q − dmin·m` with 2-bit `q`. Value `128n + 32j + l`
//! (`n < 2`, `j < 4`, `l < 32`) is bits `2j..2j + 2` of `qs[32n + l]`, in
//! sub-block `8n + 2j + l / 16`.

use super::fit::fit_affine;
use super::{f16_at, to_f16};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 84;

/// The per-sub-block multipliers `d·sc[j]` and offsets `dmin·m[j]`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> ([f32; 16], [f32; 16]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    (
        std::array::from_fn(|j| d * (b[j] & 0x0F) as f32),
        std::array::from_fn(|j| dmin * (b[j] >> 4) as f32),
    )
}

/// The 64 bytes of 2-bit values.
#[inline(always)]
pub(crate) fn qs(b: &[u8; BLOCK_BYTES]) -> &[u8] {
    &b[16..80]
}

/// Where value `i` of a Q2_K or Q3_K super-block sits (the two share the
/// layout of their 2-bit fields; see the module documentation).
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    /// Byte of the 64 bytes of 2-bit fields.
    pub byte: usize,
    /// Bit of that byte where the field starts.
    pub shift: usize,
    /// Sub-block of 16 (its scale).
    pub sub: usize,
    /// Byte of Q3_K's 32 bytes of third bits.
    pub lane: usize,
    /// Bit of that byte holding the third bit.
    pub plane: usize,
}

/// The [`Slot`] of value `i` (`128n + 32j + l`).
#[inline(always)]
pub(crate) fn slot(i: usize) -> Slot {
    let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
    Slot {
        byte: 32 * n + l,
        shift: 2 * j,
        sub: 8 * n + 2 * j + l / 16,
        lane: l,
        plane: 4 * n + j,
    }
}

/// `out[i] = (d·sc[j]) · q[i] − dmin·m[j]` for `i` in sub-block `j`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let (dl, ml) = sub_scales(b);
    let qs = qs(b);
    for (i, o) in out.iter_mut().enumerate() {
        let at = slot(i);
        let q = (qs[at.byte] >> at.shift) & 3;
        *o = dl[at.sub] * q as f32 - ml[at.sub];
    }
}

/// Fits each sub-block of 16 with [`fit_affine`] (`q ∈ 0..=3`), stores
/// `d = max s / 15` and `dmin = max m / 15` as f16, rounds the sub-block
/// scales and minimums to four bits relative to those, and re-quantizes
/// the values with the stored (rounded) parameters.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let mut s = [0.0f32; 16];
    let mut m = [0.0f32; 16];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        (s[j], m[j]) = fit_affine(sub, 3);
    }
    let smax = s.iter().fold(0.0f32, |a, &v| a.max(v));
    let mmax = m.iter().fold(0.0f32, |a, &v| a.max(v));
    let (db, d) = to_f16(smax / 15.0);
    let (mb, dmin) = to_f16(mmax / 15.0);
    let four = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 15.0) as u8
        } else {
            0
        }
    };
    out.fill(0);
    for j in 0..16 {
        out[j] = four(s[j], d) | (four(m[j], dmin) << 4);
    }
    out[80..82].copy_from_slice(&db);
    out[82..84].copy_from_slice(&mb);
    let (dl, ml) = sub_scales(out);
    for (i, &v) in x.iter().enumerate() {
        let at = slot(i);
        let (dl, ml) = (dl[at.sub], ml[at.sub]);
        let q = if dl > 0.0 {
            ((v + ml) / dl).round().clamp(0.0, 3.0) as u8
        } else {
            0
        };
        out[16 + at.byte] |= q << at.shift;
    }
}
