//! AVX-512 VNNI integer dot products of four Q8_0 weight rows with one to
//! four 16-bit activation rows at once (the output head of a batched step).
//!
//! `dpbusd` multiplies unsigned by signed bytes, so the weights are offset
//! to `w + 128` once per block for all activation rows, and `128 · Σ x` of
//! each 4-byte lane is subtracted again: the 32-bit block sums are the very
//! integers of `avx2_i8::dot_i16_rows`, and the float steps after them are
//! the same operations in the same order, so the results are bit-identical.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C, AVX-512F, AVX-512VL,
//! AVX-512BW and AVX-512 VNNI (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::hsum;
use super::avx2_i8::{f16_pair, load32, prefetch, ROWS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK};
use crate::quant::q8_0;

/// Most activation rows per call.
pub(crate) const TILE: usize = 4;

/// `dot_i16_rows` of the four Q8_0 weight rows `w` with each of `T`
/// activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn tile<const T: usize>(w: [&[u8]; ROWS], xs: &[Q16Row<'_>]) -> [[f32; ROWS]; T] {
    let xs: [Q16Row<'_>; T] = std::array::from_fn(|t| xs[t]);
    let nb = xs[0].d.len();
    let ws = w.map(|r| &r.as_chunks::<{ q8_0::BLOCK_BYTES }>().0[..nb]);
    let his = xs.map(|x| bytemuck::cast_slice::<i8, u8>(x.hi));
    let los = xs.map(|x| bytemuck::cast_slice::<i8, u8>(x.lo));
    let offset = _mm256_set1_epi8(i8::MIN);
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); ROWS]; T];
    let ahead = 2 * ROWS * nb * q8_0::BLOCK_BYTES;
    for i in 0..nb {
        for r in ws {
            prefetch(&r[i], ahead);
        }
        let us: [__m256i; ROWS] =
            std::array::from_fn(|r| _mm256_xor_si256(load32(&ws[r][i][2..]), offset));
        let dw: [__m128; ROWS] = std::array::from_fn(|r| f16_pair(&ws[r][i][..4]));
        for t in 0..T {
            let hi = load32(&his[t][i * BLOCK..]);
            let lo = load32(&los[t][i * BLOCK..]);
            let corr_hi = _mm256_dpbusd_epi32(zero, offset, hi);
            let corr_lo = _mm256_dpbusd_epi32(zero, offset, lo);
            let dx = _mm_set_ss(xs[t].d[i]);
            for r in 0..ROWS {
                let ph = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, us[r], hi), corr_hi);
                let pl = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, us[r], lo), corr_lo);
                let p = _mm256_add_epi32(_mm256_slli_epi32::<7>(ph), pl);
                let s = _mm_mul_ss(dw[r], dx);
                acc[t][r] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(s), acc[t][r]);
            }
        }
    }
    acc.map(|a| a.map(|v| hsum(v) + 0.0))
}

/// The outputs of the four Q8_0 weight rows `w` for each of the one to
/// [`TILE`] activation rows `xs`, into `out[t]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) fn dot_i16_tile_q8_0(w: [&[u8]; ROWS], xs: &[Q16Row<'_>], out: &mut [[f32; ROWS]]) {
    debug_assert!(xs.len() <= TILE && out.len() >= xs.len());
    match xs.len() {
        0 => {}
        1 => out[..1].copy_from_slice(&tile::<1>(w, xs)),
        2 => out[..2].copy_from_slice(&tile::<2>(w, xs)),
        3 => out[..3].copy_from_slice(&tile::<3>(w, xs)),
        _ => out[..4].copy_from_slice(&tile::<4>(w, xs)),
    }
}
