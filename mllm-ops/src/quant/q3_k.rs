//! Q3_K: 256 values per 110-byte super-block:
//! `[hmask: 32 bytes][qs: 64 bytes][scales: 12 bytes][d: f16]`.
//!
//! Sixteen sub-blocks of 16 values each have a 6-bit scale `sc` stored
//! with an offset of 32; `x = d·(sc − 32)·(q − 4)` with 3-bit `q`. Value
//! `128n + 32j + l` (`n < 2`, `j < 4`, `l < 32`) takes its low two bits
//! from bits `2j..2j + 2` of `qs[32n + l]` and its third bit from bit
//! `4n + j` of `hmask[l]`, in sub-block `8n + 2j + l / 16`.
//!
//! The twelve scale bytes pack the sixteen 6-bit numbers: the low four
//! bits of scale `i` are the low nibble of byte `i` (`i < 8`) or the high
//! nibble of byte `i − 8`; its top two bits are bits `2(i / 4)..` of byte
//! `8 + i % 4`.

use super::fit::fit_symmetric;
use super::q2_k::slot;
use super::{f16_at, to_f16};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 110;

/// Decodes the sixteen 6-bit scales (0..=63, before the offset).
#[inline(always)]
pub(crate) fn unpack_scales(s: &[u8]) -> [u8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        low | (high << 4)
    })
}

/// Packs sixteen 6-bit scales into 12 bytes.
pub(crate) fn pack_scales(sc: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (i, &v) in sc.iter().enumerate() {
        if i < 8 {
            s[i] |= v & 0x0F;
        } else {
            s[i - 8] |= (v & 0x0F) << 4;
        }
        s[8 + i % 4] |= ((v >> 4) & 3) << (2 * (i / 4));
    }
    s
}

/// The per-sub-block multipliers `d·(sc[j] − 32)`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> [f32; 16] {
    let d = f16_at(b, 108);
    unpack_scales(&b[96..108]).map(|s| d * (s as i32 - 32) as f32)
}

/// The 3-bit value `q − 4` (`−4..=3`) of element `i` of the block.
#[inline(always)]
pub(crate) fn value(b: &[u8; BLOCK_BYTES], i: usize) -> i32 {
    let at = slot(i);
    let low = (b[32 + at.byte] >> at.shift) & 3;
    let high = (b[at.lane] >> at.plane) & 1;
    low as i32 - if high == 1 { 0 } else { 4 }
}

/// `out[i] = (d·(sc[j] − 32)) · (q[i] − 4)` for `i` in sub-block `j`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let dl = sub_scales(b);
    for (i, o) in out.iter_mut().enumerate() {
        *o = dl[slot(i).sub] * value(b, i) as f32;
    }
}

/// Fits each sub-block of 16 with [`fit_symmetric`] (`q ∈ −4..=3`), stores
/// `d = max |s| / 31` as f16, rounds the sub-block scales to `−32..=31`
/// relative to it, and re-quantizes the values with the stored scales.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let s: [f32; 16] = std::array::from_fn(|j| fit_symmetric(&x[16 * j..16 * j + 16], 4));
    let amax = s.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let (db, d) = to_f16(amax / 31.0);
    let sc: [u8; 16] = s.map(|v| {
        let k = if d > 0.0 {
            (v / d).round().clamp(-32.0, 31.0) as i32
        } else {
            0
        };
        (k + 32) as u8
    });
    out.fill(0);
    out[96..108].copy_from_slice(&pack_scales(&sc));
    out[108..110].copy_from_slice(&db);
    let dl = sub_scales(out);
    for (i, &v) in x.iter().enumerate() {
        let at = slot(i);
        let s = dl[at.sub];
        let q = if s != 0.0 {
            ((v / s).round().clamp(-4.0, 3.0) + 4.0) as u8
        } else {
            4
        };
        out[32 + at.byte] |= (q & 3) << at.shift;
        out[at.lane] |= (q >> 2) << at.plane;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        let sc: [u8; 16] = std::array::from_fn(|i| ((i * 29 + 7) % 64) as u8);
        assert_eq!(unpack_scales(&pack_scales(&sc)), sc);
    }
}
