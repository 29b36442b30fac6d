//! AVX2 products of a packed f16 or bf16 row group (see `packed_half`)
//! with one to six f32 activation rows. A group stores each pair of
//! columns as its eight rows' two values side by side, so one 128-bit
//! load converted to f32 holds both columns of four rows, even columns in
//! the even lanes and odd ones in the odd lanes: per pair of columns two
//! such loads, and one 64-bit broadcast of an activation row's two values
//! there feeds both. The even and odd lanes of a row add up at the end.
//! Two consecutive groups go through together for one or two rows, and
//! one after the other for more: with the broadcasts shared by a group's
//! two halves, one group over six rows fills fifteen of the sixteen
//! registers (both groups over three rows would spill, and convert each
//! weight once per three rows).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::{store, store_pair};
use super::inline_array;
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS};
use crate::cpu::kernels::packed_half::{COLUMN_BYTES, HALF_GROUP_TILE_TOKENS, PAIR_BYTES};

/// The 16 bytes at the start of `b` (four rows' values at a pair of
/// columns, f16, or bf16 when `BF16`) as f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn four_rows<const BF16: bool>(b: &[u8]) -> __m256 {
    let b = &b[..PAIR_BYTES / 2];
    // SAFETY: `b` holds 16 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    if BF16 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    } else {
        _mm256_cvtph_ps(v)
    }
}

/// An activation row's two values at a pair of columns as the bits of
/// one f64 (the first in the low half), for a 64-bit broadcast.
#[inline]
pub(crate) fn pair_bits(x: &[f32; 2]) -> f64 {
    f64::from_bits(u64::from(x[0].to_bits()) | u64::from(x[1].to_bits()) << 32)
}

/// An activation row's two values at a pair of columns, four times over.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pair_x(x: &[f32; 2]) -> __m256 {
    _mm256_castpd_ps(_mm256_set1_pd(pair_bits(x)))
}

/// The eight outputs of a group from the sums of its rows 0..4 (`lo`) and
/// 4..8 (`hi`): each row's even lane plus its odd lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn row_sums(lo: __m256, hi: __m256) -> __m256 {
    // Rows 0, 1, 4, 5 | 2, 3, 6, 7, then in order.
    let s = _mm256_castps_pd(_mm256_hadd_ps(lo, hi));
    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(s))
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
        .as_chunks::<PAIR_BYTES>()
        .0;
    let n = columns.len();
    // A forced-inline map here and a loop for the sums below: with
    // `std::array` functions their closures stayed calls (see
    // `inline_array`), and one thread's products ran 1.03-1.04x slower.
    let pairs: [&[[f32; 2]]; T] = inline_array::from_fn(|t| &xs[t].as_chunks::<2>().0[..n]);
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(pairs.iter().all(|p| p.len() == n));
    let mut lo = [_mm256_setzero_ps(); T];
    let mut hi = [_mm256_setzero_ps(); T];
    let mut ahead = super::prefetch::Streams::new(group, 1, reads);
    for k in 0..n {
        let two = &columns[k];
        ahead.next(PAIR_BYTES);
        if k % 2 == 0 {
            super::prefetch::into_l1(two);
        }
        let w_lo = four_rows::<BF16>(&two[..PAIR_BYTES / 2]);
        let w_hi = four_rows::<BF16>(&two[PAIR_BYTES / 2..]);
        for t in 0..T {
            let x = pair_x(&pairs[t][k]);
            lo[t] = _mm256_fmadd_ps(x, w_lo, lo[t]);
            hi[t] = _mm256_fmadd_ps(x, w_hi, hi[t]);
        }
    }
    let mut sums = [_mm256_setzero_ps(); T];
    for t in 0..T {
        sums[t] = row_sums(lo[t], hi[t]);
    }
    sums
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

/// Rows up to which two groups go through together ([`pair_dot`]): four
/// converted loads, eight accumulators and a broadcast. A decode step's
/// one row then keeps four sums in flight instead of two (one group
/// alone waits on its two sums' latency), which one group over six rows
/// does not need.
const PAIR_TILE_TOKENS: usize = 2;

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
    let columns_a = a[..len].as_chunks::<PAIR_BYTES>().0;
    let columns_b = b[..len].as_chunks::<PAIR_BYTES>().0;
    let n = columns_a.len();
    let pairs: [&[[f32; 2]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<2>().0[..n]);
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(columns_b.len() == n && pairs.iter().all(|p| p.len() == n));
    let mut lo = [[_mm256_setzero_ps(); T]; 2];
    let mut hi = [[_mm256_setzero_ps(); T]; 2];
    let mut ahead = super::prefetch::Streams::new(a, 2, reads);
    for k in 0..n {
        let (ta, tb) = (&columns_a[k], &columns_b[k]);
        ahead.next(PAIR_BYTES);
        if k % 2 == 0 {
            super::prefetch::into_l1(ta);
            super::prefetch::into_l1(tb);
        }
        let w_lo = [ta, tb].map(|g| four_rows::<BF16>(&g[..PAIR_BYTES / 2]));
        let w_hi = [ta, tb].map(|g| four_rows::<BF16>(&g[PAIR_BYTES / 2..]));
        for t in 0..T {
            let x = pair_x(&pairs[t][k]);
            for g in 0..2 {
                lo[g][t] = _mm256_fmadd_ps(x, w_lo[g], lo[g][t]);
                hi[g][t] = _mm256_fmadd_ps(x, w_hi[g], hi[g][t]);
            }
        }
    }
    std::array::from_fn(|g| std::array::from_fn(|t| row_sums(lo[g][t], hi[g][t])))
}

/// The outputs of two consecutive packed groups `a` and `b` for one to
/// `HALF_TILE_TOKENS` activation rows: `out[t]` for `a`,
/// `out[xs.len() + t]` for `b`. Up to [`PAIR_TILE_TOKENS`] rows go through
/// both groups at once, more through one group after the other,
/// `HALF_GROUP_TILE_TOKENS` at a time.
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
    let out = (out_a, out_b);
    match rows {
        0 => {}
        1 => store_pair(pair_tile::<1, BF16>(a, b, xs, reads), out),
        PAIR_TILE_TOKENS => store_pair(pair_tile::<PAIR_TILE_TOKENS, BF16>(a, b, xs, reads), out),
        _ => {
            for (group, out) in [(a, out.0), (b, out.1)] {
                let tiles = xs.chunks(HALF_GROUP_TILE_TOKENS);
                for (pass, (xs, out)) in tiles
                    .zip(out.chunks_mut(HALF_GROUP_TILE_TOKENS))
                    .enumerate()
                {
                    group_dot::<BF16>(group, xs, out, reads.of_pass(pass));
                }
            }
        }
    }
}
