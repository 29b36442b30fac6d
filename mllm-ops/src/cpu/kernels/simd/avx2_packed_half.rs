//! AVX2 products of a packed f16 or bf16 row group (see `packed_half`)
//! with one to six f32 activation rows: per pair of columns two 128-bit
//! loads, each a column of the eight rows converted to f32, and one
//! broadcast activation value per row and column into the even- and
//! odd-column accumulators. Two consecutive groups go through together,
//! three activation rows at a time ([`PAIR_TILE_TOKENS`]): each broadcast
//! then feeds two fused multiply-adds, one per group: 22 instructions for
//! 12 of them where one group over six rows took 26 (and spilled), and the
//! core issues only so many a cycle.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::{store, store_pair};
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS};
use crate::cpu::kernels::packed_half::{COLUMN_BYTES, HALF_GROUP_TILE_TOKENS};

/// Activation rows per pass over a pair of groups: twelve accumulators
/// (even and odd columns of two groups for three rows), two converted
/// columns and a broadcast fill fifteen of the sixteen registers.
const PAIR_TILE_TOKENS: usize = 3;

/// The eight 16-bit values at the start of `b` (f16, or bf16 when `BF16`)
/// as f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn column<const BF16: bool>(b: &[u8]) -> __m256 {
    let b = &b[..COLUMN_BYTES];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    if BF16 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    } else {
        _mm256_cvtph_ps(v)
    }
}

/// The eight outputs of one packed group for `T` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn tile<const T: usize, const BF16: bool>(
    group: &[u8],
    xs: &[&[f32]],
    reads: WeightReads,
) -> [__m256; T] {
    let columns = group[..xs[0].len() * COLUMN_BYTES]
        .as_chunks::<{ 2 * COLUMN_BYTES }>()
        .0;
    let n = columns.len();
    let pairs: [&[[f32; 2]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<2>().0[..n]);
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(pairs.iter().all(|p| p.len() == n));
    let mut even = [_mm256_setzero_ps(); T];
    let mut odd = [_mm256_setzero_ps(); T];
    let mut ahead = super::prefetch::Streams::new(group, 1, reads);
    for k in 0..n {
        let two = &columns[k];
        ahead.next(2 * COLUMN_BYTES);
        if T > 1 && k % 2 == 0 {
            super::prefetch::into_l1(two);
        }
        let w0 = column::<BF16>(&two[..COLUMN_BYTES]);
        let w1 = column::<BF16>(&two[COLUMN_BYTES..]);
        for t in 0..T {
            let [x0, x1] = pairs[t][k];
            even[t] = _mm256_fmadd_ps(_mm256_set1_ps(x0), w0, even[t]);
            odd[t] = _mm256_fmadd_ps(_mm256_set1_ps(x1), w1, odd[t]);
        }
    }
    std::array::from_fn(|t| _mm256_add_ps(even[t], odd[t]))
}

/// The eight outputs of one packed group for each of one to
/// `HALF_GROUP_TILE_TOKENS` activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn group_dot<const BF16: bool>(
    group: &[u8],
    xs: &[&[f32]],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    debug_assert!(xs.len() <= HALF_GROUP_TILE_TOKENS && out.len() >= xs.len());
    let mut put = |acc: &[__m256]| {
        for (o, a) in out.iter_mut().zip(acc) {
            store(o, *a);
        }
    };
    match xs.len() {
        0 => {}
        1 => put(&tile::<1, BF16>(group, xs, reads)),
        2 => put(&tile::<2, BF16>(group, xs, reads)),
        3 => put(&tile::<3, BF16>(group, xs, reads)),
        4 => put(&tile::<4, BF16>(group, xs, reads)),
        5 => put(&tile::<5, BF16>(group, xs, reads)),
        _ => put(&tile::<6, BF16>(group, xs, reads)),
    }
}

/// The eight outputs of each of two packed groups `a` and `b` for `T`
/// activation rows (`T` at most [`PAIR_TILE_TOKENS`]): per output the same
/// operations as [`tile`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pair_tile<const T: usize, const BF16: bool>(
    a: &[u8],
    b: &[u8],
    xs: &[&[f32]],
    reads: WeightReads,
) -> [[__m256; T]; 2] {
    let len = xs[0].len() * COLUMN_BYTES;
    let columns_a = a[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0;
    let columns_b = b[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0;
    let n = columns_a.len();
    let pairs: [&[[f32; 2]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<2>().0[..n]);
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(columns_b.len() == n && pairs.iter().all(|p| p.len() == n));
    let mut even = [[_mm256_setzero_ps(); T]; 2];
    let mut odd = [[_mm256_setzero_ps(); T]; 2];
    let mut ahead = super::prefetch::Streams::new(a, 2, reads);
    for k in 0..n {
        let (ta, tb) = (&columns_a[k], &columns_b[k]);
        ahead.next(2 * COLUMN_BYTES);
        if T > 1 && k % 2 == 0 {
            super::prefetch::into_l1(ta);
            super::prefetch::into_l1(tb);
        }
        let wa = column::<BF16>(&ta[..COLUMN_BYTES]);
        let wb = column::<BF16>(&tb[..COLUMN_BYTES]);
        for t in 0..T {
            let x = _mm256_set1_ps(pairs[t][k][0]);
            even[0][t] = _mm256_fmadd_ps(x, wa, even[0][t]);
            even[1][t] = _mm256_fmadd_ps(x, wb, even[1][t]);
        }
        let wa = column::<BF16>(&ta[COLUMN_BYTES..]);
        let wb = column::<BF16>(&tb[COLUMN_BYTES..]);
        for t in 0..T {
            let x = _mm256_set1_ps(pairs[t][k][1]);
            odd[0][t] = _mm256_fmadd_ps(x, wa, odd[0][t]);
            odd[1][t] = _mm256_fmadd_ps(x, wb, odd[1][t]);
        }
    }
    std::array::from_fn(|g| std::array::from_fn(|t| _mm256_add_ps(even[g][t], odd[g][t])))
}

/// The outputs of two consecutive packed groups `a` and `b` for one to
/// `HALF_TILE_TOKENS` activation rows, [`PAIR_TILE_TOKENS`] at a time:
/// `out[t]` for `a`, `out[xs.len() + t]` for `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pair_dot<const BF16: bool>(
    a: &[u8],
    b: &[u8],
    xs: &[&[f32]],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    let rows = xs.len();
    debug_assert!(out.len() >= 2 * rows);
    let (out_a, out_b) = out.split_at_mut(rows);
    for (i, xs) in xs.chunks(PAIR_TILE_TOKENS).enumerate() {
        let reads = reads.of_pass(i);
        let at = i * PAIR_TILE_TOKENS;
        let out = (&mut out_a[at..], &mut out_b[at..]);
        match xs.len() {
            1 => store_pair(pair_tile::<1, BF16>(a, b, xs, reads), out),
            2 => store_pair(pair_tile::<2, BF16>(a, b, xs, reads), out),
            _ => store_pair(pair_tile::<3, BF16>(a, b, xs, reads), out),
        }
    }
}
