//! AMX products of packed Q6_K row-group pairs (see `packed_q6k`) with up
//! to `amx_kquant::MAX_TILES` tiles of 16 activation rows: the scheme of
//! `amx_kquant` with Q6_K's weights. Per super-block and group pair, each
//! value becomes `sc·(q − 32)` (its half's signed 8-bit scale times the
//! centred 6-bit value, `|·| ≤ 4096`), split into an unsigned low byte and
//! a signed high byte: two B operands per 64 columns, whose tile products
//! with one activation plane (`tdpbsud` and `tdpbssd`) give
//! `Σ_h sc_h·Σ (q − 32)·x = 256·high + low` over the whole super-block,
//! the integers of `packed_q6k`'s formula, exact; the float step
//! `vnni_packed_q6k::pair_add_super` then gives the AVX-512 kernels' bits.
//!
//! Every function here is a safe `#[target_feature]` function or takes
//! configured tiles ([`FullTiles`]): callers must only reach it after
//! detecting the AVX-512 level's features and AMX (see `QuantKernel`).

use std::arch::asm;
use std::arch::x86_64::*;

use super::amx::{FullTiles, TILE_ROWS};
use super::amx_kquant::{
    byte_pair_sums, per_lane, so_far, store_row, tile_products, Folded, PlaneProducts, RowTiles,
    TileSums, CHUNK,
};
use crate::cpu::kernels::packed::GROUP_ROWS;
use crate::cpu::kernels::packed_q6k::{BITS_AT, BLOCKS, BLOCK_BITS, SCALES_AT, SUPER_BYTES};
use crate::cpu::kernels::qact::{Q16Row, BYTE};

/// Operands per chunk: the low and the high bytes of `sc·(q − 32)`.
const PLANES: usize = 2;

/// Makes the tile products of one activation plane of 16 rows (row 0's
/// first column of a super-block at `a`, the rows `stride` bytes apart)
/// with a folded super-block, and stores them into `sums`.
///
/// # Safety
/// `tiles` holds the configuration, and each of the 16 rows has the 256
/// bytes from `row 0 + t·stride` readable.
#[inline(always)]
unsafe fn plane_products(
    _tiles: &FullTiles,
    a: *const i8,
    stride: usize,
    folded: &Folded<PLANES>,
    sums: &mut [[[i32; TILE_ROWS]; TILE_ROWS]; PLANES],
) {
    // SAFETY: the registers are configured (`FullTiles`) with 16 rows of
    // 64 bytes; each A load reads 64 bytes of each of the 16 rows (the
    // caller's guarantee), each B load one 1 KiB operand of `folded`, and
    // the stores write 1 KiB of `sums` each.
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        for (c, operands) in folded.0.iter().enumerate() {
            asm!(
                "tileloadd tmm3, [{a} + {stride}*1]",
                "tileloadd tmm4, [{low} + {row}*1]",
                "tileloadd tmm5, [{high} + {row}*1]",
                "tdpbsud tmm0, tmm3, tmm4",
                "tdpbssd tmm1, tmm3, tmm5",
                a = in(reg) a.wrapping_add(CHUNK * c),
                stride = in(reg) stride,
                low = in(reg) operands[0].as_ptr(),
                high = in(reg) operands[1].as_ptr(),
                row = in(reg) CHUNK,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{low} + {row}*1], tmm0",
            "tilestored [{high} + {row}*1], tmm1",
            low = in(reg) sums[0].as_mut_ptr(),
            high = in(reg) sums[1].as_mut_ptr(),
            row = in(reg) 4 * TILE_ROWS,
            options(nostack),
        );
    }
}

/// Folds block `j` of a pair's super-block (`sa`, `sb`) into its eight B
/// operand rows of `folded` (rows `8·(j mod 2)..` of chunk `j / 2`): each
/// 6-bit value `q` of a half (rows `4h..4h + 4`) times its row's scale of
/// that half, `sc·(q − 32)`, as low and high bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn fold_block(folded: &mut Folded<PLANES>, j: usize, (sa, sb): (&[u8], &[u8])) {
    use super::vnni_packed_q6k::pair_block_values;
    let at = BITS_AT + BLOCK_BITS * j;
    let values = pair_block_values(&sa[at..at + BLOCK_BITS], &sb[at..at + BLOCK_BITS]);
    let (zero, bytes) = (_mm512_setzero_si512(), _mm512_set1_epi16(0xFF));
    let centre = _mm512_set1_epi16(32);
    let operands = &mut folded.0[j / 2];
    for (h, values) in values.into_iter().enumerate() {
        let sc_at = SCALES_AT + GROUP_ROWS * (2 * j + h);
        let sc = per_lane(&sa[sc_at..], &sb[sc_at..]);
        // The signed scales as 16-bit lanes, in the unpack order.
        let sc_lo = _mm512_srai_epi16::<8>(_mm512_unpacklo_epi8(zero, sc));
        let sc_hi = _mm512_srai_epi16::<8>(_mm512_unpackhi_epi8(zero, sc));
        for (c, v) in values.into_iter().enumerate() {
            let q_lo = _mm512_sub_epi16(_mm512_unpacklo_epi8(v, zero), centre);
            let q_hi = _mm512_sub_epi16(_mm512_unpackhi_epi8(v, zero), centre);
            let (p_lo, p_hi) = (
                _mm512_mullo_epi16(q_lo, sc_lo),
                _mm512_mullo_epi16(q_hi, sc_hi),
            );
            let low =
                _mm512_packus_epi16(_mm512_and_si512(p_lo, bytes), _mm512_and_si512(p_hi, bytes));
            let high =
                _mm512_packs_epi16(_mm512_srai_epi16::<8>(p_lo), _mm512_srai_epi16::<8>(p_hi));
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
/// `d` the pair's scales there) to its rows' outputs in `out`, as
/// `amx_kquant::add_tile` does.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
fn add_tile<const SHIFT: u32>(
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    (t, first_block): (usize, usize),
    sums: &TileSums<PLANES>,
    rows: &[Q16Row<'_, SHIFT>],
    d: __m512,
) {
    use super::vnni_packed_q6k::pair_add_super;
    for (r, x) in rows.iter().enumerate() {
        let lo = if SHIFT == BYTE {
            _mm512_setzero_si512()
        } else {
            byte_pair_sums(sums, 1, r)
        };
        let row = TILE_ROWS * t + r;
        let acc = so_far(out, n, row, first_block);
        let hi = byte_pair_sums(sums, 0, r);
        let acc = pair_add_super::<SHIFT>(acc, d, (hi, lo), x.d[first_block]);
        store_row(out, n, row, acc);
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
    let mut folded = Folded::<PLANES>::new();
    let mut sums = TileSums::<PLANES>::new();
    for s in 0..rows.supers() {
        let pairs = groups.chunks_exact(2 * group_bytes);
        for (pair, out) in pairs.zip(out.chunks_exact_mut(2 * n)) {
            let (a, b) = pair.split_at(group_bytes);
            let sa = &a[s * SUPER_BYTES..][..SUPER_BYTES];
            let sb = &b[s * SUPER_BYTES..][..SUPER_BYTES];
            for j in 0..BLOCKS {
                fold_block(&mut folded, j, (sa, sb));
            }
            let d = super::vnni_packed::f16x16(&sa[..16], &sb[..16]);
            for t in 0..rows.tiles() {
                let folded = (&folded, plane_products as PlaneProducts<PLANES>);
                tile_products::<SHIFT, PLANES>(tiles, rows, (t, s), folded, &mut sums);
                let tile_rows = &rows.rows()[TILE_ROWS * t..][..TILE_ROWS];
                let at = (t, s * BLOCKS);
                add_tile::<SHIFT>((&mut *out, n), at, &sums, tile_rows, d);
            }
        }
    }
}
