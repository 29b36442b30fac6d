//! AVX2 product of a packed f16 or bf16 row group (see `packed_half`) with
//! one to six f32 activation rows: per pair of columns two 128-bit loads,
//! each a column of the eight rows converted to f32, and one broadcast
//! activation value per row and column into the even- and odd-column
//! accumulators.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::packed::GROUP_ROWS;
use crate::cpu::kernels::packed_half::{COLUMN_BYTES, HALF_GROUP_TILE_TOKENS};

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
fn tile<const T: usize, const BF16: bool>(group: &[u8], xs: &[&[f32]]) -> [__m256; T] {
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
    let mut ahead = super::prefetch::Streams::new(group, 1, T);
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
) {
    debug_assert!(xs.len() <= HALF_GROUP_TILE_TOKENS && out.len() >= xs.len());
    let mut put = |acc: &[__m256]| {
        for (o, a) in out.iter_mut().zip(acc) {
            store(o, *a);
        }
    };
    match xs.len() {
        0 => {}
        1 => put(&tile::<1, BF16>(group, xs)),
        2 => put(&tile::<2, BF16>(group, xs)),
        3 => put(&tile::<3, BF16>(group, xs)),
        4 => put(&tile::<4, BF16>(group, xs)),
        5 => put(&tile::<5, BF16>(group, xs)),
        _ => put(&tile::<6, BF16>(group, xs)),
    }
}
