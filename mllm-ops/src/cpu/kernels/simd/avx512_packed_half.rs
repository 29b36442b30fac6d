//! AVX-512 product of one or two consecutive packed f16 or bf16 row
//! groups (see `packed_half`) with the one to `HALF_TILE_TOKENS` f32
//! activation rows of a tile panel (`packed_half::fill_panels`), on
//! 512-bit vectors: lanes 0..8 hold the first group's rows, lanes 8..16
//! the second's. Lane by lane the operations of `avx2_packed_half` (the
//! same fused multiply-adds in the same order), so the same bits.
//!
//! The panel holds the tile's rows side by side, column pair by column
//! pair, so every broadcast in the loop is a fixed offset from one
//! pointer. With twelve separate rows the loop kept twelve pointers in
//! the sixteen general registers and spent about as many instructions
//! moving them as multiplying (58 % of the f32 peak on a Sapphire Rapids
//! class Xeon).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C and AVX-512F (see
//! `QuantKernel`).

use std::arch::x86_64::*;

use super::vnni_packed::store_pair;
use crate::cpu::kernels::matmul::HalfBits;
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

/// The outputs of groups `a` and `b` for the `T` activation rows of
/// `panel` (`streams` is 2 when `b` follows `a`, 1 when it is `a` again).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn pair_tile<const T: usize, const BF16: bool>(
    a: &[u8],
    b: &[u8],
    panel: &[f32],
    streams: usize,
    reads: WeightReads,
) -> [__m512; T] {
    let steps = panel.as_chunks::<2>().0.as_chunks::<T>().0;
    let n = steps.len();
    let len = n * 2 * COLUMN_BYTES;
    let cols_a = a[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0;
    let cols_b = b[..len].as_chunks::<{ 2 * COLUMN_BYTES }>().0;
    // Every slice indexed by `k` below has exactly `n` items; said once
    // here, so the loop carries no bounds checks.
    assert!(cols_a.len() == n && cols_b.len() == n);
    let mut even = [_mm512_setzero_ps(); T];
    let mut odd = [_mm512_setzero_ps(); T];
    let mut ahead = super::prefetch::Streams::new(a, streams, reads);
    for k in 0..n {
        let (ta, tb, xk) = (&cols_a[k], &cols_b[k], &steps[k]);
        ahead.next(2 * COLUMN_BYTES);
        if T > 1 && k % 2 == 0 {
            super::prefetch::into_l1(ta);
            super::prefetch::into_l1(tb);
        }
        if T > 1 {
            super::prefetch::panel_into_l1(xk.as_flattened());
        }
        let w0 = columns::<BF16>(&ta[..COLUMN_BYTES], &tb[..COLUMN_BYTES]);
        let w1 = columns::<BF16>(&ta[COLUMN_BYTES..], &tb[COLUMN_BYTES..]);
        for t in 0..T {
            let [x0, x1] = xk[t];
            even[t] = _mm512_fmadd_ps(_mm512_set1_ps(x0), w0, even[t]);
            odd[t] = _mm512_fmadd_ps(_mm512_set1_ps(x1), w1, odd[t]);
        }
    }
    std::array::from_fn(|t| _mm512_add_ps(even[t], odd[t]))
}

/// The outputs of `groups` (one packed group of `kind`, or two consecutive
/// ones of `group_bytes` each) for the activation rows of a tile panel
/// (`panel`: its values and its one to `HALF_TILE_TOKENS` rows): `out[t]`
/// for the first group, `out[rows + t]` for the second.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) fn panel_dot(
    kind: HalfBits,
    groups: &[u8],
    group_bytes: usize,
    panel: (&[f32], usize),
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    match kind {
        HalfBits::F16 => kind_panel_dot::<false>(groups, group_bytes, panel, out, reads),
        HalfBits::Bf16 => kind_panel_dot::<true>(groups, group_bytes, panel, out, reads),
    }
}

/// [`panel_dot`] for f16 groups, or bf16 ones when `BF16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
fn kind_panel_dot<const BF16: bool>(
    groups: &[u8],
    group_bytes: usize,
    (panel, tokens): (&[f32], usize),
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    debug_assert!((1..=HALF_TILE_TOKENS).contains(&tokens));
    let (a, b, streams) = match groups.split_at_checked(group_bytes) {
        Some((a, b)) if !b.is_empty() => (a, b, 2),
        // One group: it takes both halves of the vectors and the second
        // half's outputs are dropped.
        _ => (groups, groups, 1),
    };
    let mut both = [[0.0f32; GROUP_ROWS]; 2 * HALF_TILE_TOKENS];
    let put = &mut both[..2 * tokens];
    match tokens {
        1 => store_pair(&pair_tile::<1, BF16>(a, b, panel, streams, reads), put),
        2 => store_pair(&pair_tile::<2, BF16>(a, b, panel, streams, reads), put),
        3 => store_pair(&pair_tile::<3, BF16>(a, b, panel, streams, reads), put),
        4 => store_pair(&pair_tile::<4, BF16>(a, b, panel, streams, reads), put),
        5 => store_pair(&pair_tile::<5, BF16>(a, b, panel, streams, reads), put),
        6 => store_pair(&pair_tile::<6, BF16>(a, b, panel, streams, reads), put),
        7 => store_pair(&pair_tile::<7, BF16>(a, b, panel, streams, reads), put),
        8 => store_pair(&pair_tile::<8, BF16>(a, b, panel, streams, reads), put),
        9 => store_pair(&pair_tile::<9, BF16>(a, b, panel, streams, reads), put),
        10 => store_pair(&pair_tile::<10, BF16>(a, b, panel, streams, reads), put),
        11 => store_pair(&pair_tile::<11, BF16>(a, b, panel, streams, reads), put),
        _ => store_pair(&pair_tile::<12, BF16>(a, b, panel, streams, reads), put),
    }
    let n = streams * tokens;
    out[..n].copy_from_slice(&put[..n]);
}
