//! AMX products of two packed Q4, Q5 or Q8_0 row groups (see `packed`,
//! `packed_q5` and `packed_q8`) with many tiles of 16 activation rows,
//! each pair's B operands set once for all of them ([`pairs_by_spans`]):
//! the steps of `vnni_packed`'s `scaled_block_pair_tile` and of
//! `vnni_packed_q8`'s `pair_tile`, with the blocks' sums from tile
//! products (`amx`), eight blocks at a time. The same integers and float
//! steps in the same order, so the results equal the AVX-512 kernels' bit
//! for bit.
//!
//! Every function here is a safe `#[target_feature]` function that takes
//! configured tiles: callers must only reach it after detecting the
//! AVX-512 level's features and AMX (see `QuantKernel`).

use std::arch::x86_64::*;

use super::amx::{TileRows, Tiles, SPAN, TILE_ROWS};
use super::avx2_i8::load32;
use super::vnni_packed::{join, pair_add_block};
use crate::cpu::kernels::packed::GROUP_ROWS;

/// The values of two groups' packed Q4 blocks or Q4_K sub-blocks (`a`'s
/// in the low halves, `b`'s in the high ones) per chunk of the packed
/// nibble layout: the low nibbles, then the high ones.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
#[inline]
pub(crate) fn nibble_pair_values(a: &[u8], b: &[u8]) -> [[__m512i; 2]; 4] {
    let low4 = _mm512_set1_epi8(0x0F);
    std::array::from_fn(|c| {
        let v = join(load32(&a[32 * c..]), load32(&b[32 * c..]));
        [
            _mm512_and_si512(v, low4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4),
        ]
    })
}

/// Sets sub-block `j`'s values in `tiles` from a group pair's values per
/// chunk of the packed nibble layout (`[low, high]` for each of the four
/// chunks, as [`nibble_pair_values`] gives them): the four
/// chunks' low values are its first 16 columns, their high values the last.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn set_chunk_values(tiles: &mut Tiles, j: usize, chunks: [[__m512i; 2]; 4]) {
    let [[l0, h0], [l1, h1], [l2, h2], [l3, h3]] = chunks;
    tiles.set_values(j, [l0, l1, l2, l3, h0, h1, h2, h3]);
}

/// Adds activation block `i` to every row's outputs `acc` from the tiles'
/// sums of sub-block `j`: the float step `pair_add_block` of the AVX-512
/// kernels with the scales and offsets `scales` of the 16 weight rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn add_sums<const SHIFT: u32>(
    acc: &mut [__m512; TILE_ROWS],
    tiles: &Tiles,
    rows: &TileRows<'_, SHIFT>,
    (j, i): (usize, usize),
    scales: (__m512, __m512),
) {
    for (t, acc) in acc.iter_mut().enumerate() {
        let (hi, lo) = tiles.sums::<SHIFT>(j, t);
        *acc = pair_add_block::<SHIFT>(*acc, scales, hi, lo, rows.block_scale(t, i));
    }
}

/// The outputs of every pair of consecutive groups in `groups` (of
/// `group_bytes` each, blocks of `BLOCK_BYTES`) for the row tiles
/// `row_tiles` (16 rows each; `n` rows in all, at least the tiles'):
/// `out[2n·p + t]` and `out[2n·p + n + t]` for pair `p` and row `t`.
///
/// Span by span of blocks: `set(tiles, j, (a's block, b's block))` puts
/// a pair's sub-block `j` into the B operands (values signed with
/// `signed`) and gives its scales, once for all the tiles; then per tile
/// the tile products, and `step(acc, tiles, rows, (j, i), scales)` adds
/// sub-block `j` (activation block `i`) to the 16 rows' outputs `acc`.
/// Each row's outputs pass from span to span through `out`, so every row
/// gets its float steps in the order of a kernel that keeps them in
/// registers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn pairs_by_spans<const BLOCK_BYTES: usize, const SHIFT: u32, S: Copy>(
    tiles: &mut Tiles,
    (groups, group_bytes): (&[u8], usize),
    row_tiles: &[TileRows<'_, SHIFT>],
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    (set, signed): (
        impl Fn(&mut Tiles, usize, BlockPair<'_, BLOCK_BYTES>) -> S,
        bool,
    ),
    step: impl Fn(&mut [__m512; TILE_ROWS], &Tiles, &TileRows<'_, SHIFT>, (usize, usize), S),
) {
    use super::amx::next_piece_into_l2;
    use super::amx_kquant::TileOutputs;
    let Some(first_tile) = row_tiles.first() else {
        return;
    };
    assert!(
        row_tiles.len() * TILE_ROWS <= n,
        "more tile rows than outputs"
    );
    let nb = first_tile.blocks();
    assert!(
        row_tiles.iter().all(|rows| rows.blocks() == nb),
        "tiles of one width"
    );
    for first in (0..nb).step_by(SPAN) {
        let count = SPAN.min(nb - first);
        let at = first * BLOCK_BYTES..(first + count) * BLOCK_BYTES;
        let pairs = groups.chunks_exact(2 * group_bytes);
        for (p, (pair, out)) in pairs.zip(out.chunks_exact_mut(2 * n)).enumerate() {
            next_piece_into_l2(groups, group_bytes, (p, first / SPAN), SPAN * BLOCK_BYTES);
            let (a, b) = pair.split_at(group_bytes);
            let sa = a[at.clone()].as_chunks::<BLOCK_BYTES>().0;
            let sb = b[at.clone()].as_chunks::<BLOCK_BYTES>().0;
            let mut scales = [None; SPAN];
            for (j, blocks) in sa.iter().zip(sb).enumerate() {
                scales[j] = Some(set(tiles, j, blocks));
            }
            for (t, rows) in row_tiles.iter().enumerate() {
                tiles.products(rows, first, count, signed);
                let mut outputs = TileOutputs::new(&mut *out, n, t);
                let mut acc: [__m512; TILE_ROWS] =
                    std::array::from_fn(|r| outputs.so_far(r, first));
                for (j, &s) in scales.iter().flatten().enumerate() {
                    step(&mut acc, tiles, rows, (j, first + j), s);
                }
                for (r, &acc) in acc.iter().enumerate() {
                    outputs.store(r, acc);
                }
            }
        }
    }
}

/// One block of each of a pair's two groups.
pub(crate) type BlockPair<'b, const BLOCK_BYTES: usize> =
    (&'b [u8; BLOCK_BYTES], &'b [u8; BLOCK_BYTES]);

/// Defines `pairs::<SHIFT>`, [`pairs_by_spans`] for a layout of
/// `$block_bytes` per block that starts with the eight rows' f16 scales
/// and offsets, whose bits two groups give as values through
/// `$pair_values` (as [`nibble_pair_values`]), with the float steps of
/// [`add_sums`].
macro_rules! scaled_block_amx_pairs {
    ($block_bytes:expr, $pair_values:path) => {
        use std::arch::x86_64::__m512;

        use $crate::cpu::kernels::packed::{GROUP_ROWS, NIBBLES_AT};
        use $crate::cpu::kernels::simd::amx::{TileRows, Tiles, TILE_ROWS};

        /// The outputs of every pair of consecutive groups in `groups`
        /// for the row tiles `row_tiles`, as [`pairs_by_spans`] lays them
        /// out.
        ///
        /// [`pairs_by_spans`]: $crate::cpu::kernels::simd::amx_packed::pairs_by_spans
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) fn pairs<const SHIFT: u32>(
            tiles: &mut Tiles,
            groups: (&[u8], usize),
            row_tiles: &[TileRows<'_, SHIFT>],
            out: (&mut [[f32; GROUP_ROWS]], usize),
        ) {
            use $crate::cpu::kernels::simd::amx_packed::{
                add_sums, pairs_by_spans, set_chunk_values, BlockPair,
            };
            use $crate::cpu::kernels::simd::vnni_packed::f16x16;
            const BYTES: usize = $block_bytes;
            let set = |tiles: &mut Tiles, j: usize, (ka, kb): BlockPair<'_, BYTES>| {
                let values = $pair_values(&ka[NIBBLES_AT..], &kb[NIBBLES_AT..]);
                set_chunk_values(tiles, j, values);
                (
                    f16x16(&ka[..16], &kb[..16]),
                    f16x16(&ka[16..32], &kb[16..32]),
                )
            };
            let step =
                |acc: &mut [__m512; TILE_ROWS],
                 tiles: &Tiles,
                 rows: &TileRows<'_, SHIFT>,
                 at: (usize, usize),
                 scales: (__m512, __m512)| { add_sums(acc, tiles, rows, at, scales) };
            pairs_by_spans::<BYTES, SHIFT, _>(tiles, groups, row_tiles, out, (set, false), step);
        }
    };
}

/// Q4_0 and Q4_1 blocks.
pub(crate) mod q4 {
    scaled_block_amx_pairs!(
        crate::cpu::kernels::packed::PACKED_BLOCK_BYTES,
        crate::cpu::kernels::simd::amx_packed::nibble_pair_values
    );
}

/// Q5_0 and Q5_1 blocks.
pub(crate) mod q5 {
    scaled_block_amx_pairs!(
        crate::cpu::kernels::packed_q5::Q5_PACKED_BLOCK_BYTES,
        crate::cpu::kernels::simd::vnni_packed_q5::pair_values
    );
}

/// Q8_0 blocks: signed weights, whose chunks of the two groups, joined,
/// are already the B operand's rows.
pub(crate) mod q8 {
    use super::*;
    use crate::cpu::kernels::packed::GROUP_ROWS;
    use crate::cpu::kernels::packed_q8::Q8_PACKED_BLOCK_BYTES;
    use crate::cpu::kernels::qact::{BYTE, NARROW};
    use crate::cpu::kernels::simd::avx2_i8::load32;
    use crate::cpu::kernels::simd::inline_array::from_fn;
    use crate::cpu::kernels::simd::vnni_packed::{f16x16, join};

    /// Adds sub-block `j` of the last tile products (activation block `i`)
    /// to the outputs `acc` of the 16 rows of `rows`, `d` the 16 weight
    /// rows' scales: per row `acc = fma(2^SHIFT·Σ w·hi + Σ w·lo, d·d_x,
    /// acc)`, the float step of `vnni_packed_q8`'s `pair_tile`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    #[inline]
    fn block_step<const SHIFT: u32>(
        acc: &mut [__m512; TILE_ROWS],
        tiles: &Tiles,
        rows: &TileRows<'_, SHIFT>,
        (j, i): (usize, usize),
        d: __m512,
    ) {
        for (t, acc) in acc.iter_mut().enumerate() {
            let (hi, lo) = tiles.sums::<SHIFT>(j, t);
            let p = if SHIFT == BYTE {
                hi
            } else {
                _mm512_add_epi32(_mm512_slli_epi32::<{ NARROW }>(hi), lo)
            };
            let (dx, _) = rows.block_scale(t, i);
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, *acc);
        }
    }

    /// The outputs of every pair of consecutive groups in `groups` for
    /// the row tiles `row_tiles`, as [`pairs_by_spans`] lays them out, with
    /// the float steps of [`block_step`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(crate) fn pairs<const SHIFT: u32>(
        tiles: &mut Tiles,
        groups: (&[u8], usize),
        row_tiles: &[TileRows<'_, SHIFT>],
        out: (&mut [[f32; GROUP_ROWS]], usize),
    ) {
        const BYTES: usize = Q8_PACKED_BLOCK_BYTES;
        let set = |tiles: &mut Tiles, j: usize, (ka, kb): BlockPair<'_, BYTES>| {
            let chunk = |c: usize| join(load32(&ka[16 + 32 * c..]), load32(&kb[16 + 32 * c..]));
            tiles.set_values(j, from_fn(chunk));
            f16x16(&ka[..16], &kb[..16])
        };
        let step = |acc: &mut [__m512; TILE_ROWS],
                    tiles: &Tiles,
                    rows: &TileRows<'_, SHIFT>,
                    at: (usize, usize),
                    d: __m512| block_step(acc, tiles, rows, at, d);
        pairs_by_spans::<BYTES, SHIFT, _>(tiles, groups, row_tiles, out, (set, true), step);
    }
}
