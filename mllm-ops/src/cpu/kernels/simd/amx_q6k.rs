//! AMX products of packed Q6_K row-group pairs (see `packed_q6k`) with up
//! to `amx_kquant::MAX_TILES` tiles of 16 activation rows: the scheme of
//! `amx_kquant` with Q6_K's weights. Per super-block and group pair, each
//! value becomes `sc·(q − 32)` (its half's signed 8-bit scale times the
//! centred 6-bit value, `|·| ≤ 4096`), split into an unsigned low byte and
//! a signed high byte: two B operands per 64 columns, whose tile products
//! with one activation plane (`tdpbsud` and `tdpbssd`, two planes or two
//! tiles at once as `amx_kquant::each_tile` takes them) give
//! `Σ_h sc_h·Σ (q − 32)·x = 256·high + low` over the whole super-block,
//! the integers of `packed_q6k`'s formula, exact; the float step
//! `vnni_packed_q6k::pair_add_super` then gives the AVX-512 kernels' bits.
//!
//! Every function here is a safe `#[target_feature]` function or takes
//! configured tiles ([`FullTiles`]): callers must only reach it after
//! detecting the AVX-512 level's features and AMX (see `QuantKernel`).

use std::arch::x86_64::*;

use super::amx::{next_piece_into_l2, FullTiles, TILE_ROWS};
use super::amx_kquant::{
    byte_pair_sums, each_tile, low_and_high_bytes, per_lane, scales_by_parity, Folded, PlaneSums,
    RowScales, RowTiles, SignedHigh, TileOutputs, TileSums, CHUNK,
};
use crate::cpu::kernels::packed::GROUP_ROWS;
use crate::cpu::kernels::packed_q6k::{BITS_AT, BLOCKS, BLOCK_BITS, SCALES_AT, SUPER_BYTES};

/// Folds block `j` of a pair's super-block (`sa`, `sb`) into its eight B
/// operand rows of `folded` (rows `8·(j mod 2)..` of chunk `j / 2`): each
/// 6-bit value `q` of a half (rows `4h..4h + 4`) times its row's scale of
/// that half, `sc·(q − 32)`, as low and high bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn fold_block(folded: &mut Folded, j: usize, (sa, sb): (&[u8], &[u8])) {
    use super::vnni_packed_q6k::pair_block_values;
    let at = BITS_AT + BLOCK_BITS * j;
    let values = pair_block_values(&sa[at..at + BLOCK_BITS], &sb[at..at + BLOCK_BITS]);
    let operands = &mut folded.0[j / 2];
    for (h, values) in values.into_iter().enumerate() {
        let sc_at = SCALES_AT + GROUP_ROWS * (2 * j + h);
        let sc = per_lane(&sa[sc_at..], &sb[sc_at..]);
        // `sc·(q − 32)` in place: `sc·q` of the even and of the odd bytes
        // in their 16-bit lanes (`scales_by_parity`), each less `32·sc`
        // (the signed scales widened to their lanes).
        let (sc_even, sc_odd) = scales_by_parity(sc);
        let centre_even =
            _mm512_slli_epi16::<5>(_mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(sc)));
        let centre_odd = _mm512_slli_epi16::<5>(_mm512_srai_epi16::<8>(sc));
        for (c, v) in values.into_iter().enumerate() {
            let even = _mm512_sub_epi16(_mm512_maddubs_epi16(v, sc_even), centre_even);
            let odd = _mm512_sub_epi16(_mm512_maddubs_epi16(v, sc_odd), centre_odd);
            let (low, high) = low_and_high_bytes(even, odd);
            let at = CHUNK * (8 * (j % 2) + 4 * h + c);
            for (plane, v) in [low, high].into_iter().enumerate() {
                let row = &mut operands[plane][at..at + CHUNK];
                // SAFETY: `row` is 64 bytes (sliced above) and `storeu`
                // has no alignment requirement.
                unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), v) };
            }
        }
    }
}

/// Adds tile `t`'s sums of a super-block (`first_block` its first block,
/// `d` the pair's scales there) from its high plane's sums `hi` and its
/// low plane's `lo` (none for 8-bit rows), with the rows' scales `dx`, to
/// its rows' outputs in `out`, as `amx_kquant::add_tile` does.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn add_tile<const SHIFT: u32>(
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    (t, first_block): (usize, usize),
    (hi, lo): (&PlaneSums, Option<&PlaneSums>),
    dx: &[f32; TILE_ROWS],
    d: __m512,
) {
    use super::vnni_packed_q6k::pair_add_super;
    let mut outputs = TileOutputs::new(out, n, t);
    for (r, &dx) in dx.iter().enumerate() {
        let sum_lo = lo.map_or(_mm512_setzero_si512(), |lo| byte_pair_sums(lo, r));
        let acc = outputs.so_far(r, first_block);
        let sum_hi = byte_pair_sums(hi, r);
        let acc = pair_add_super::<SHIFT>(acc, d, (sum_hi, sum_lo), dx);
        outputs.store(r, acc);
    }
}

/// The outputs of each pair of consecutive packed Q6_K groups in `groups`
/// (of `group_bytes` each) for the row tiles `rows`, on the configured
/// `tiles`: `out[2n·p + t]` and `out[2n·p + n + t]` for pair `p` and row
/// `t`, super-block by super-block as `amx_kquant`'s kernel goes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) fn pairs<const SHIFT: u32>(
    tiles: &FullTiles,
    groups: &[u8],
    group_bytes: usize,
    rows: &RowTiles<'_, '_, SHIFT>,
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
) {
    let mut folded = Folded::new();
    let mut sums = TileSums::new();
    let mut dx = RowScales::new();
    for s in 0..rows.supers() {
        dx.set(rows.rows(), s * BLOCKS);
        let pairs = groups.chunks_exact(2 * group_bytes);
        for (p, (pair, out)) in pairs.zip(out.chunks_exact_mut(2 * n)).enumerate() {
            next_piece_into_l2(groups, group_bytes, (p, s), SUPER_BYTES);
            let (a, b) = pair.split_at(group_bytes);
            let sa = &a[s * SUPER_BYTES..][..SUPER_BYTES];
            let sb = &b[s * SUPER_BYTES..][..SUPER_BYTES];
            for j in 0..BLOCKS {
                fold_block(&mut folded, j, (sa, sb));
            }
            let d = super::vnni_packed::f16x16(&sa[..16], &sb[..16]);
            each_tile::<SignedHigh, SHIFT>(tiles, rows, s, &folded, &mut sums, |t, hi, lo| {
                let at = (t, s * BLOCKS);
                add_tile::<SHIFT>((&mut *out, n), at, (hi, lo), dx.tile(t), d);
            });
        }
    }
}
