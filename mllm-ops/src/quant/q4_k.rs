//! Q4_K: 256 values per 144-byte super-block:
//! `[d: f16][dmin: f16][scales: 12 bytes][qs: 128 bytes]`.
//!
//! The super-block has eight sub-blocks of 32 values, each with a 6-bit
//! scale `sc` and a 6-bit minimum `m`; `x = d·sc·q − dmin·m`.
//!
//! The twelve scale bytes pack the 16 six-bit numbers: for `j < 4`, byte `j`
//! holds `sc[j]` and byte `j + 4` holds `m[j]` in their low six bits; for
//! `j ≥ 4`, byte `j + 4` holds the low four bits of `sc[j]` (low nibble) and
//! of `m[j]` (high nibble), and their top two bits sit in the top two bits
//! of bytes `j − 4` (for `sc`) and `j` (for `m`).
//!
//! Each 32-byte group `g` of `qs` holds sub-blocks `2g` (low nibbles) and
//! `2g + 1` (high nibbles): value `64g + l` is `qs[32g + l] & 15` and value
//! `64g + 32 + l` is `qs[32g + l] >> 4`.

use super::fit::fit_affine;
use super::{f16_at, to_f16};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 144;

/// Decodes the eight 6-bit scales and minimums from the 12 packed bytes.
#[inline(always)]
pub(crate) fn unpack_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, m)
}

/// Packs eight 6-bit scales and minimums into 12 bytes.
pub(crate) fn pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    s
}

/// The per-sub-block multipliers `d·sc[j]` and offsets `dmin·m[j]`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> ([f32; 8], [f32; 8]) {
    header_scales(b)
}

/// [`sub_scales`] of the 16-byte header `d, dmin, scales` at the start of
/// `b` (shared by Q4_K and Q5_K).
#[inline(always)]
pub(crate) fn header_scales(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let (sc, m) = unpack_scales(&b[4..16]);
    (sc.map(|s| d * s as f32), m.map(|v| dmin * v as f32))
}

/// The 128 bytes of nibbles.
#[inline(always)]
pub(crate) fn qs(b: &[u8; BLOCK_BYTES]) -> &[u8] {
    &b[16..]
}

/// `out[i] = (d·sc[j]) · q[i] − dmin·m[j]` for `i` in sub-block `j`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let (dl, ml) = sub_scales(b);
    for (g, (group, vals)) in qs(b)
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let (lo, hi) = vals.split_at_mut(32);
        for ((&q, l), h) in group.iter().zip(lo).zip(hi) {
            *l = dl[2 * g] * (q & 0x0F) as f32 - ml[2 * g];
            *h = dl[2 * g + 1] * (q >> 4) as f32 - ml[2 * g + 1];
        }
    }
}

/// The 16 header bytes (`d`, `dmin`, packed scales) of a Q4_K or Q5_K
/// super-block for `x` with values in `0..=qmax`, and the sub-block
/// multipliers and offsets they store (as [`sub_scales`] reads them).
///
/// Fits each sub-block with [`fit_affine`], stores `d = max s / 63` and
/// `dmin = max m / 63` as f16, and rounds the sub-block scales and minimums
/// to six bits relative to those.
pub(crate) fn fit_header(x: &[f32; BLOCK_LEN], qmax: u8) -> ([u8; 16], [f32; 8], [f32; 8]) {
    let mut s = [0.0f32; 8];
    let mut m = [0.0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        (s[j], m[j]) = fit_affine(sub, qmax);
    }
    let smax = s.iter().fold(0.0f32, |a, &v| a.max(v));
    let mmax = m.iter().fold(0.0f32, |a, &v| a.max(v));
    let (db, d) = to_f16(smax / 63.0);
    let (mb, dmin) = to_f16(mmax / 63.0);
    let six = |v: f32, unit: f32| {
        if unit > 0.0 {
            (v / unit).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc = s.map(|v| six(v, d));
    let mi = m.map(|v| six(v, dmin));
    let mut header = [0u8; 16];
    header[0..2].copy_from_slice(&db);
    header[2..4].copy_from_slice(&mb);
    header[4..16].copy_from_slice(&pack_scales(&sc, &mi));
    (
        header,
        sc.map(|v| d * v as f32),
        mi.map(|v| dmin * v as f32),
    )
}

/// `x` re-quantized with a stored sub-block multiplier `dl` and offset
/// `ml`: `round((x + ml) / dl)` in `0..=qmax`.
#[inline]
pub(crate) fn requantize(x: f32, dl: f32, ml: f32, qmax: u8) -> u8 {
    if dl > 0.0 {
        ((x + ml) / dl).round().clamp(0.0, qmax as f32) as u8
    } else {
        0
    }
}

/// The header of [`fit_header`] with `qmax = 15`, then the values
/// re-quantized with the stored (rounded) parameters.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let (header, dl, ml) = fit_header(x, 15);
    out[..16].copy_from_slice(&header);
    let q = |j: usize, v: f32| requantize(v, dl[j], ml[j], 15);
    for g in 0..4 {
        for l in 0..32 {
            let lo = q(2 * g, x[64 * g + l]);
            let hi = q(2 * g + 1, x[64 * g + 32 + l]);
            out[16 + 32 * g + l] = lo | (hi << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        let sc = [0, 1, 17, 63, 32, 47, 5, 60];
        let m = [63, 2, 31, 0, 16, 63, 40, 9];
        let packed = pack_scales(&sc, &m);
        assert_eq!(unpack_scales(&packed), (sc, m));
    }
}
