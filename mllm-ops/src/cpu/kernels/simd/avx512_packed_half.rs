//! AVX-512 product of one or two consecutive packed f16 or bf16 row
//! groups (see `packed_half`) with the one to `HALF_TILE_TOKENS` f32
//! activation rows of a tile panel (`packed_half::panels`), on
//! 512-bit vectors: a group's values at a pair of columns fill one vector
//! (one 256-bit load, converted), each row's even column in an even lane
//! and its odd column in the odd lane after it, and one 64-bit broadcast
//! of an activation row's two values there feeds every group of the pass.
//! Lane by lane the operations of `avx2_packed_half` (the same fused
//! multiply-adds in the same order, and each row's even sum plus its odd
//! one at the end), so the same bits.
//!
//! The panel holds the tile's rows side by side, column pair by column
//! pair, so every broadcast in the loop is a fixed offset from one
//! pointer. With twelve separate rows the loop kept twelve pointers in
//! the sixteen general registers and spent about as many instructions
//! moving them as multiplying (58 % of the f32 peak on a Sapphire Rapids
//! class Xeon). With a broadcast per column (before the pair layout) the
//! loads, not the multiply-adds, bounded the loop on that Xeon: halving
//! them made the 1.1B F16 prefill 6 % faster.
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA, F16C and AVX-512F (see
//! `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2_packed_half::pair_bits;
use crate::cpu::kernels::matmul::HalfBits;
use crate::cpu::kernels::packed::{WeightReads, GROUP_ROWS};
use crate::cpu::kernels::packed_half::{HALF_TILE_TOKENS, PAIR_BYTES};

/// One group's values at a pair of columns (32 bytes at the start of
/// `b`: each row's even then odd column, f16, or bf16 when `BF16`) as
/// sixteen f32 (exact).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn eight_rows<const BF16: bool>(b: &[u8]) -> __m512 {
    let b = &b[..PAIR_BYTES];
    // SAFETY: `b` holds 32 bytes (sliced above) and `loadu` has no
    // alignment requirement.
    let v = unsafe { _mm256_loadu_si256(b.as_ptr().cast()) };
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    } else {
        _mm512_cvtph_ps(v)
    }
}

/// An activation row's two values at a pair of columns, eight times over.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn pair_x(x: &[f32; 2]) -> __m512 {
    _mm512_castpd_ps(_mm512_set1_pd(pair_bits(x)))
}

/// Stores a group's eight outputs from its sums `acc` (each row's even and
/// odd lanes added).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn store_rows(acc: __m512, out: &mut [f32; GROUP_ROWS]) {
    // Each lane plus its neighbour; the even lanes hold the rows in order.
    let sums = _mm512_add_ps(acc, _mm512_permute_ps::<0b10_11_00_01>(acc));
    let rows = _mm512_cvtepi64_epi32(_mm512_castps_si512(sums));
    // SAFETY: `out` holds 8 floats and `storeu` has no alignment
    // requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), rows) }
}

/// The sums of the `G` groups `groups` (one, or two consecutive ones) for
/// the `T` activation rows of `panel`: per pair of columns one converted
/// load per group and one broadcast per row, which feeds every group.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn tile<const G: usize, const T: usize, const BF16: bool>(
    groups: [&[u8]; G],
    panel: &[f32],
    reads: WeightReads,
) -> [[__m512; T]; G] {
    let steps = panel.as_chunks::<2>().0.as_chunks::<T>().0;
    let n = steps.len();
    let columns = groups.map(|g| &g[..n * PAIR_BYTES].as_chunks::<PAIR_BYTES>().0[..n]);
    let mut acc = [[_mm512_setzero_ps(); T]; G];
    let mut ahead = super::prefetch::Streams::new(groups[0], G, reads);
    for k in 0..n {
        let xk = &steps[k];
        ahead.next(PAIR_BYTES);
        if k % 2 == 0 {
            for c in &columns {
                super::prefetch::into_l1(&c[k]);
            }
        }
        if T > 1 {
            super::prefetch::panel_into_l1(xk.as_flattened());
        }
        let w: [__m512; G] = std::array::from_fn(|g| eight_rows::<BF16>(&columns[g][k]));
        for t in 0..T {
            let x = pair_x(&xk[t]);
            for g in 0..G {
                acc[g][t] = _mm512_fmadd_ps(x, w[g], acc[g][t]);
            }
        }
    }
    acc
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
    match groups.split_at_checked(group_bytes) {
        Some((a, b)) if !b.is_empty() => groups_dot::<2, BF16>([a, b], (panel, tokens), out, reads),
        _ => groups_dot::<1, BF16>([groups], (panel, tokens), out, reads),
    }
}

/// [`kind_panel_dot`] of the `G` groups `groups`, through the tile of the
/// panel's row count.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn groups_dot<const G: usize, const BF16: bool>(
    groups: [&[u8]; G],
    (panel, tokens): (&[f32], usize),
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    match tokens {
        1 => store(&tile::<G, 1, BF16>(groups, panel, reads), out),
        2 => store(&tile::<G, 2, BF16>(groups, panel, reads), out),
        3 => store(&tile::<G, 3, BF16>(groups, panel, reads), out),
        4 => store(&tile::<G, 4, BF16>(groups, panel, reads), out),
        5 => store(&tile::<G, 5, BF16>(groups, panel, reads), out),
        6 => store(&tile::<G, 6, BF16>(groups, panel, reads), out),
        7 => store(&tile::<G, 7, BF16>(groups, panel, reads), out),
        8 => store(&tile::<G, 8, BF16>(groups, panel, reads), out),
        9 => store(&tile::<G, 9, BF16>(groups, panel, reads), out),
        10 => store(&tile::<G, 10, BF16>(groups, panel, reads), out),
        11 => store(&tile::<G, 11, BF16>(groups, panel, reads), out),
        _ => store(&tile::<G, 12, BF16>(groups, panel, reads), out),
    }
}

/// Stores the outputs of `G` groups for `T` rows: `out[g * T + t]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
#[inline]
fn store<const G: usize, const T: usize>(acc: &[[__m512; T]; G], out: &mut [[f32; GROUP_ROWS]]) {
    for (g, acc) in acc.iter().enumerate() {
        for (t, a) in acc.iter().enumerate() {
            store_rows(*a, &mut out[g * T + t]);
        }
    }
}
