//! Q6_K: 256 values per 210-byte super-block:
//! `[ql: 128 bytes][qh: 64 bytes][scales: 16 × i8][d: f16]`.
//!
//! Sixteen sub-blocks of 16 values each have a signed 8-bit scale `sc`;
//! `x = d·sc·(q − 32)` with 6-bit `q`. Each half `h` of 128 values uses
//! `ql[64h..64h + 64]` and `qh[32h..32h + 32]`: for `l < 32`, values
//! `128h + l`, `+ 32`, `+ 64` and `+ 96` take their low four bits from the
//! low nibble of `ql[64h + l]`, the low nibble of `ql[64h + 32 + l]`, the
//! high nibble of `ql[64h + l]` and the high nibble of `ql[64h + 32 + l]`,
//! and their top two bits from bits 0–1, 2–3, 4–5 and 6–7 of `qh[32h + l]`.

use super::fit::fit_symmetric6;
use super::{f16_at, to_f16};

/// Values per super-block.
pub(crate) const BLOCK_LEN: usize = 256;
/// Bytes per super-block.
pub(crate) const BLOCK_BYTES: usize = 210;

/// The per-sub-block multipliers `d·sc[j]`.
#[inline(always)]
pub(crate) fn sub_scales(b: &[u8; BLOCK_BYTES]) -> [f32; 16] {
    let d = f16_at(b, 208);
    std::array::from_fn(|j| d * (b[192 + j] as i8) as f32)
}

/// The 256 six-bit values `q` of a super-block, in order.
#[inline(always)]
pub(crate) fn values(b: &[u8; BLOCK_BYTES]) -> [u8; BLOCK_LEN] {
    let mut q = [0u8; BLOCK_LEN];
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let vals = &mut q[128 * h..128 * h + 128];
        for l in 0..32 {
            vals[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            vals[32 + l] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            vals[64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            vals[96 + l] = (ql[l + 32] >> 4) | ((qh[l] >> 6) << 4);
        }
    }
    q
}

/// `out[i] = (d·sc[i / 16]) · (q[i] − 32)`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let dl = sub_scales(b);
    for (i, (o, q)) in out.iter_mut().zip(values(b)).enumerate() {
        *o = dl[i / 16] * (q as i32 - 32) as f32;
    }
}

/// Fits each sub-block with [`fit_symmetric6`], stores `d = max |s| / 127`
/// as f16, rounds the sub-block scales to `i8` relative to it, and
/// re-quantizes the values with the stored (rounded) scales.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let s: [f32; 16] = std::array::from_fn(|j| fit_symmetric6(&x[16 * j..16 * j + 16]));
    let amax = s.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let (db, d) = to_f16(amax / 127.0);
    let sc: [i8; 16] = s.map(|v| {
        if d > 0.0 {
            (v / d).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        }
    });
    out.fill(0);
    for (i, &v) in x.iter().enumerate() {
        let dl = d * sc[i / 16] as f32;
        let q = if dl != 0.0 {
            ((v / dl).round().clamp(-32.0, 31.0) + 32.0) as u8
        } else {
            32
        };
        let (h, r) = (i / 128, i % 128);
        let (k, l) = (r / 32, r % 32);
        let low = q & 0x0F;
        out[64 * h + 32 * (k % 2) + l] |= if k < 2 { low } else { low << 4 };
        out[128 + 32 * h + l] |= (q >> 4) << (2 * k);
    }
    for (o, &s) in out[192..208].iter_mut().zip(&sc) {
        *o = s as u8;
    }
    out[208..210].copy_from_slice(&db);
}
