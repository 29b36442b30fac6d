//! AVX-512 product of two consecutive packed f16 or bf16 row groups (see
//! `packed_half`) with one to `HALF_TILE_TOKENS` f32 activation rows on
//! 512-bit vectors:
//! lanes 0..8 hold the first group's rows, lanes 8..16 the second's. Lane
//! by lane the operations of `avx2_packed_half` (the same fused
//! multiply-adds in the same order), so the same bits.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C and AVX-512F (see
//! `QuantKernel`).

use std::arch::x86_64::*;

use super::vnni_packed::store_pair;
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS};
use crate::cpu::kernels::packed_half::{COLUMN_BYTES, HALF_TILE_TOKENS};

/// Column `a` of the first group and column `b` of the second (16 bytes
/// each, f16, or bf16 when `BF16`) as sixteen f32 (exact).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn columns<const BF16: bool>(a: &[u8], b: &[u8]) -> __m512 {
    let (a, b) = (&a[..COLUMN_BYTES], &b[..COLUMN_BYTES]);
    // SAFETY: `a` and `b` hold 16 bytes each (sliced above) and `loadu`
    // has no alignment requirement.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(a.as_ptr().cast()),
            _mm_loadu_si128(b.as_ptr().cast()),
        )
    };
    let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b);
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    } else {
        _mm512_cvtph_ps(v)
    }
}

/// The outputs of groups `a` and `b` for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn pair_tile<const T: usize, const BF16: bool>(
    a: &[u8],
    b: &[u8],
    xs: &[&[f32]],
    reads: WeightReads,
) -> [__m512; T] {
    let len = xs[0].len() * COLUMN_BYTES;
    let cols_a = a[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0;
    let n = cols_a.len();
    let cols_b = &b[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0[..n];
    let pairs: [&[[f32; 2]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<2>().0[..n]);
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(pairs.iter().all(|p| p.len() == n));
    let mut even = [_mm512_setzero_ps(); T];
    let mut odd = [_mm512_setzero_ps(); T];
    let mut ahead = super::prefetch::Streams::new(a, 2, reads);
    for k in 0..n {
        let (ta, tb) = (&cols_a[k], &cols_b[k]);
        ahead.next(2 * COLUMN_BYTES);
        if T > 1 && k % 2 == 0 {
            super::prefetch::into_l1(ta);
            super::prefetch::into_l1(tb);
        }
        let w0 = columns::<BF16>(&ta[..COLUMN_BYTES], &tb[..COLUMN_BYTES]);
        let w1 = columns::<BF16>(&ta[COLUMN_BYTES..], &tb[COLUMN_BYTES..]);
        for t in 0..T {
            let [x0, x1] = pairs[t][k];
            even[t] = _mm512_fmadd_ps(_mm512_set1_ps(x0), w0, even[t]);
            odd[t] = _mm512_fmadd_ps(_mm512_set1_ps(x1), w1, odd[t]);
        }
    }
    std::array::from_fn(|t| _mm512_add_ps(even[t], odd[t]))
}

/// The outputs of two consecutive packed groups `a` and `b` for one to
/// `HALF_TILE_TOKENS` activation rows: `out[t]` for `a`, `out[xs.len() +
/// t]` for `b`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) fn pair_dot<const BF16: bool>(
    a: &[u8],
    b: &[u8],
    xs: &[&[f32]],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    debug_assert!(xs.len() <= HALF_TILE_TOKENS && out.len() >= 2 * xs.len());
    match xs.len() {
        0 => {}
        1 => store_pair(&pair_tile::<1, BF16>(a, b, xs, reads), out),
        2 => store_pair(&pair_tile::<2, BF16>(a, b, xs, reads), out),
        3 => store_pair(&pair_tile::<3, BF16>(a, b, xs, reads), out),
        4 => store_pair(&pair_tile::<4, BF16>(a, b, xs, reads), out),
        5 => store_pair(&pair_tile::<5, BF16>(a, b, xs, reads), out),
        6 => store_pair(&pair_tile::<6, BF16>(a, b, xs, reads), out),
        7 => store_pair(&pair_tile::<7, BF16>(a, b, xs, reads), out),
        8 => store_pair(&pair_tile::<8, BF16>(a, b, xs, reads), out),
        9 => store_pair(&pair_tile::<9, BF16>(a, b, xs, reads), out),
        10 => store_pair(&pair_tile::<10, BF16>(a, b, xs, reads), out),
        11 => store_pair(&pair_tile::<11, BF16>(a, b, xs, reads), out),
        _ => store_pair(&pair_tile::<12, BF16>(a, b, xs, reads), out),
    }
}
