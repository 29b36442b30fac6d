//! AMX products of packed Q4_K and Q5_K row-group pairs (see `packed_q4k`)
//! with up to [`MAX_TILES`] tiles of 16 activation rows.
//!
//! A tile product sums over 64 columns, two sub-blocks with scales of
//! their own; so the scales go into the weights before it. Per
//! super-block and group pair, each 6- or 5-bit value `q` becomes
//! `sc·q` (below 2^11) split into its low and high bytes, two unsigned B
//! operands per 64 columns, and a third operand holds each column's
//! minimum `m`. Against one activation plane (the A operand, read in
//! place) the three products give `Σ x·low`, `Σ x·high` and `Σ x·m` over
//! the whole super-block in three tile registers; `256·high + low` is
//! then `Σ_j sc_j·Σ q·x`, and with the plane sums joined the same way
//! `Σ_j m_j·Σ q_x`: the integers of `packed_q4k`'s formula, exact, which
//! the float step `vnni_packed_q4k::pair_add_super` turns into the bits of
//! the AVX-512 kernels.
//!
//! The folding is paid once per super-block of a pair and shared by all
//! of a call's row tiles, which is why this kernel takes many tiles at
//! once (`PackedFormat::amx_rows`).
//!
//! Every function here is a safe `#[target_feature]` function or takes
//! configured tiles ([`FullTiles`]): callers must only reach it after
//! detecting the AVX-512 level's features and AMX (see `QuantKernel`).

use std::arch::asm;
use std::arch::x86_64::*;

use super::amx::{even_stride, FullTiles, TILE_ROWS};
use crate::cpu::kernels::packed::{vnni_pair_in_chunks, PackedFormat, WeightReads, GROUP_ROWS};
use crate::cpu::kernels::qact::{Q16Row, BYTE, SUPER_BLOCK};

/// Columns per tile product: a full tile row of bytes.
pub(crate) const CHUNK: usize = 64;
/// Tile products per super-block and operand.
pub(crate) const CHUNKS: usize = SUPER_BLOCK / CHUNK;
/// Bytes of one B operand: 16 rows of four columns of 16 weight rows.
pub(crate) const OPERAND: usize = TILE_ROWS * CHUNK;
/// Operands per chunk: the low bytes of `sc·q`, its high bytes, `m`.
pub(crate) const PLANES: usize = 3;
/// Most tiles of activation rows per call.
pub(crate) const MAX_TILES: usize = 8;

/// One super-block of a group pair as `P` B operands per chunk, chunk
/// after chunk.
#[repr(C, align(64))]
pub(crate) struct Folded<const P: usize = PLANES>(pub(crate) [[[u8; OPERAND]; P]; CHUNKS]);

impl<const P: usize> Folded<P> {
    /// Operands of zeros, for a kernel's folding to fill.
    pub(crate) fn new() -> Self {
        Folded([[[0; OPERAND]; P]; CHUNKS])
    }
}

/// One tile's sums of a super-block: per activation plane (high, low)
/// and each of `P` operands, 16 activation rows of 16 weight rows' sums.
#[repr(C, align(64))]
pub(crate) struct TileSums<const P: usize = PLANES>(
    pub(crate) [[[[i32; TILE_ROWS]; TILE_ROWS]; P]; 2],
);

impl<const P: usize> TileSums<P> {
    /// Zero sums, for a kernel's tile products to fill.
    pub(crate) fn new() -> Self {
        TileSums([[[[0; TILE_ROWS]; TILE_ROWS]; P]; 2])
    }
}

/// Activation rows that tiles read in place: 16 to `16·MAX_TILES` rows
/// of one length (whole super-blocks) whose planes lie one stride apart,
/// as rows of one buffer do.
pub(crate) struct RowTiles<'r, 'a, const SHIFT: u32> {
    rows: &'r [Q16Row<'a, SHIFT>],
    /// Bytes from one row's planes to the next row's (two's complement
    /// for rows in reverse order, as `amx::TileRows` has it).
    pub(crate) stride: usize,
}

impl<'r, 'a, const SHIFT: u32> RowTiles<'r, 'a, SHIFT> {
    /// `xs` as row tiles, or `None` unless they are a whole number of
    /// tiles (at most [`MAX_TILES`]) of rows as described above.
    pub(crate) fn new(xs: &'r [Q16Row<'a, SHIFT>]) -> Option<Self> {
        let n = xs.len();
        if n == 0 || !n.is_multiple_of(TILE_ROWS) || n > MAX_TILES * TILE_ROWS {
            return None;
        }
        let stride = even_stride(xs)?;
        let whole = xs[0].hi.len().is_multiple_of(SUPER_BLOCK);
        whole.then_some(RowTiles { rows: xs, stride })
    }

    /// The rows.
    pub(crate) fn rows(&self) -> &'r [Q16Row<'a, SHIFT>] {
        self.rows
    }

    /// Tiles of 16 rows.
    pub(crate) fn tiles(&self) -> usize {
        self.rows.len() / TILE_ROWS
    }

    /// Super-blocks in each row.
    pub(crate) fn supers(&self) -> usize {
        self.rows[0].hi.len() / SUPER_BLOCK
    }

    /// The address of column `col` of the first row of tile `t` in the
    /// high plane (`lo` false) or the low one.
    pub(crate) fn plane_at(&self, t: usize, lo: bool, col: usize) -> *const i8 {
        let first = if lo { self.rows[0].lo } else { self.rows[0].hi };
        first
            .as_ptr()
            .wrapping_add((TILE_ROWS * t).wrapping_mul(self.stride))
            .wrapping_add(col)
    }
}

/// A K-quant tile kernel: the products of each group pair in `groups` (of
/// `group_bytes` each) with the row tiles, into `out` with `n` rows per
/// group (`out[2n·p + t]` and `out[2n·p + n + t]` for pair `p` and row
/// `t`), on configured tiles.
///
/// # Safety
/// The CPU has the AVX-512 level's features, and the tiles are configured
/// while the `FullTiles` lives.
pub(crate) type TileKernel<const SHIFT: u32> = unsafe fn(
    &FullTiles,
    &[u8],
    usize,
    &RowTiles<'_, '_, SHIFT>,
    (&mut [[f32; GROUP_ROWS]], usize),
);

/// `PackedFormat::amx_pairs` of a K-quant format `F` whose tile kernel is
/// `kernel`: the whole tiles of the rows `xs` (whose quantized rows are
/// `rows`) on AMX tiles, and the rows after them (fewer than a tile)
/// through the AVX-512 kernel; `false` (nothing written) when there is no
/// whole tile or the rows are not tile rows ([`RowTiles::new`]).
///
/// # Safety
/// The CPU has the AVX-512 level's features and AMX tiles this process may
/// use (`amx::tiles_available`).
pub(crate) unsafe fn tiles_then_rest<F: PackedFormat, const SHIFT: u32>(
    (groups, group_bytes): (&[u8], usize),
    (xs, rows): (&[F::Input<'_>], &[Q16Row<'_, SHIFT>]),
    out: &mut [[f32; GROUP_ROWS]],
    kernel: TileKernel<SHIFT>,
) -> bool {
    let (n, tiled) = (xs.len(), xs.len() / TILE_ROWS * TILE_ROWS);
    let Some(tile_rows) = RowTiles::new(&rows[..tiled]) else {
        return false;
    };
    {
        // SAFETY: the caller guarantees AMX and the permission to use it.
        let tiles = unsafe { FullTiles::new() };
        // SAFETY: the caller guarantees the features, and `tiles` lives
        // across the call.
        unsafe { kernel(&tiles, groups, group_bytes, &tile_rows, (&mut *out, n)) };
    }
    // SAFETY: the caller guarantees the features.
    unsafe { rest_on_vnni::<F>(groups, group_bytes, xs, tiled, out) };
    true
}

/// The products of the rows `xs[tiled..]` (fewer than a tile, after the
/// tiles an AMX kernel took) with each group pair in `groups` through the
/// AVX-512 kernel of `F`, into `out` as `PackedFormat::amx_pairs` lays it
/// out for all of `xs`.
///
/// # Safety
/// The CPU has the AVX-512 level's features (as `PackedFormat::vnni`).
unsafe fn rest_on_vnni<F: PackedFormat>(
    groups: &[u8],
    group_bytes: usize,
    xs: &[F::Input<'_>],
    tiled: usize,
    out: &mut [[f32; GROUP_ROWS]],
) {
    let (n, rest) = (xs.len(), &xs[tiled..]);
    if rest.is_empty() {
        return;
    }
    let mut part = [[0.0f32; GROUP_ROWS]; 2 * TILE_ROWS];
    let part = &mut part[..2 * rest.len()];
    for (pair, out) in groups
        .chunks_exact(2 * group_bytes)
        .zip(out.chunks_exact_mut(2 * n))
    {
        let (a, b) = pair.split_at(group_bytes);
        // SAFETY: the caller guarantees the features.
        unsafe { vnni_pair_in_chunks::<F>(a, b, rest, part, WeightReads::FromCache) };
        out[tiled..n].copy_from_slice(&part[..rest.len()]);
        out[n + tiled..].copy_from_slice(&part[rest.len()..]);
    }
}

/// Makes the tile products of one activation plane of 16 rows (row 0's
/// first column of a super-block at `a`, the rows `stride` bytes apart)
/// with a folded super-block, and stores them into `sums`.
///
/// # Safety
/// `tiles` holds the configuration, and each of the 16 rows has the 256
/// bytes from `row 0 + t·stride` readable.
#[inline(always)]
pub(crate) unsafe fn plane_products(
    _tiles: &FullTiles,
    a: *const i8,
    stride: usize,
    folded: &Folded,
    sums: &mut [[[i32; TILE_ROWS]; TILE_ROWS]; PLANES],
) {
    // SAFETY: the registers are configured (`FullTiles`) with 16 rows of
    // 64 bytes; each A load reads 64 bytes of each of the 16 rows (the
    // caller's guarantee), each B load one 1 KiB operand of `folded`, and
    // the stores write 1 KiB of `sums` each.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            options(nostack, nomem)
        );
        for (c, operands) in folded.0.iter().enumerate() {
            asm!(
                "tileloadd tmm3, [{a} + {stride}*1]",
                "tileloadd tmm4, [{low} + {row}*1]",
                "tileloadd tmm5, [{high} + {row}*1]",
                "tileloadd tmm6, [{mins} + {row}*1]",
                "tdpbsud tmm0, tmm3, tmm4",
                "tdpbsud tmm1, tmm3, tmm5",
                "tdpbsud tmm2, tmm3, tmm6",
                a = in(reg) a.wrapping_add(CHUNK * c),
                stride = in(reg) stride,
                low = in(reg) operands[0].as_ptr(),
                high = in(reg) operands[1].as_ptr(),
                mins = in(reg) operands[2].as_ptr(),
                row = in(reg) CHUNK,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{low} + {row}*1], tmm0",
            "tilestored [{high} + {row}*1], tmm1",
            "tilestored [{mins} + {row}*1], tmm2",
            low = in(reg) sums[0].as_mut_ptr(),
            high = in(reg) sums[1].as_mut_ptr(),
            mins = in(reg) sums[2].as_mut_ptr(),
            row = in(reg) 4 * TILE_ROWS,
            options(nostack),
        );
    }
}

/// The tile products of one activation plane of 16 rows with a folded
/// super-block, stored into a tile's sums of that plane: `(tiles, a,
/// stride, folded, sums)` as [`plane_products`] takes them.
///
/// # Safety
/// As [`plane_products`]: `tiles` holds the configuration, and each of the
/// 16 rows has the 256 bytes from `a + t·stride` readable.
pub(crate) type PlaneProducts<const P: usize> =
    unsafe fn(&FullTiles, *const i8, usize, &Folded<P>, &mut [[[i32; TILE_ROWS]; TILE_ROWS]; P]);

/// Makes tile `t`'s products with super-block `s`, folded in `folded`,
/// into `sums` by `products`: of both activation planes, or of the high
/// one for [`BYTE`] rows.
#[inline(always)]
pub(crate) fn tile_products<const SHIFT: u32, const P: usize>(
    tiles: &FullTiles,
    rows: &RowTiles<'_, '_, SHIFT>,
    (t, s): (usize, usize),
    (folded, products): (&Folded<P>, PlaneProducts<P>),
    sums: &mut TileSums<P>,
) {
    assert!(
        t < rows.tiles() && s < rows.supers(),
        "no such tile or super-block"
    );
    let planes: &[bool] = if SHIFT == BYTE {
        &[false]
    } else {
        &[false, true]
    };
    for (&lo, sums) in planes.iter().zip(&mut sums.0) {
        let a = rows.plane_at(t, lo, s * SUPER_BLOCK);
        // SAFETY: the tiles are configured while `tiles` lives; rows
        // `16t..16t + 16` exist (`t` is in range, checked above), lie one
        // stride apart in both planes (`RowTiles::new`), and each holds
        // `supers()` whole super-blocks, so the 256 bytes from column
        // `256·s` (`s` in range) of each are its own: `products`' contract.
        unsafe { products(tiles, a, rows.stride, folded, sums) };
    }
}

/// Each of the 16 weight rows' byte of `a` (eight rows) and `b` (eight
/// more) four times, as the lanes of a B operand's row.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn per_lane(a: &[u8], b: &[u8]) -> __m512i {
    use super::vnni_packed_q4k::u8x16;
    _mm512_mullo_epi32(u8x16(a, b), _mm512_set1_epi32(0x0101_0101))
}

/// Folds one sub-block of a pair into its eight B operand rows of
/// `folded` (rows `8·(j mod 2)..` of chunk `j / 2`): its values `values`
/// (four columns of 16 weight rows per vector, as `amx_packed`'s
/// `set_chunk_values` takes them), each times its row's scale (`sc`, per
/// lane as [`per_lane`] gives it) split into low and high bytes, and the
/// minimums `m` (per lane) on every row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn fold_sub_block(
    folded: &mut Folded,
    j: usize,
    values: [[__m512i; 2]; 4],
    (sc, m): (__m512i, __m512i),
) {
    let zero = _mm512_setzero_si512();
    let bytes = _mm512_set1_epi16(0xFF);
    let (sc_lo, sc_hi) = (
        _mm512_unpacklo_epi8(sc, zero),
        _mm512_unpackhi_epi8(sc, zero),
    );
    let [[l0, h0], [l1, h1], [l2, h2], [l3, h3]] = values;
    let operands = &mut folded.0[j / 2];
    for (k, v) in [l0, l1, l2, l3, h0, h1, h2, h3].into_iter().enumerate() {
        let p_lo = _mm512_mullo_epi16(_mm512_unpacklo_epi8(v, zero), sc_lo);
        let p_hi = _mm512_mullo_epi16(_mm512_unpackhi_epi8(v, zero), sc_hi);
        let low = _mm512_packus_epi16(_mm512_and_si512(p_lo, bytes), _mm512_and_si512(p_hi, bytes));
        let high = _mm512_packus_epi16(_mm512_srli_epi16::<8>(p_lo), _mm512_srli_epi16::<8>(p_hi));
        let at = CHUNK * (8 * (j % 2) + k);
        for (plane, v) in [low, high, m].into_iter().enumerate() {
            let row = &mut operands[plane][at..at + CHUNK];
            // SAFETY: `row` is 64 bytes (sliced above) and `storeu` has no
            // alignment requirement.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), v) };
        }
    }
}

/// Activation row `r`'s 16 sums of plane `plane` (0 high, 1 low) and
/// operand `op` in a tile's sums.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn row_sums<const P: usize>(
    sums: &TileSums<P>,
    (plane, op): (usize, usize),
    r: usize,
) -> __m512i {
    let row = &sums.0[plane][op][r];
    // SAFETY: `row` is 16 `i32` (64 bytes) and `loadu` has no alignment
    // requirement.
    unsafe { _mm512_loadu_si512(row.as_ptr().cast()) }
}

/// Activation row `r`'s `256·high + low` of plane `plane` in a tile's
/// sums whose operands 0 and 1 hold the low and the high bytes of the
/// folded weights: the sums of the weights themselves.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn byte_pair_sums<const P: usize>(
    sums: &TileSums<P>,
    plane: usize,
    r: usize,
) -> __m512i {
    let (low, high) = (row_sums(sums, (plane, 0), r), row_sums(sums, (plane, 1), r));
    _mm512_add_epi32(_mm512_slli_epi32::<8>(high), low)
}

/// Adds tile `t`'s sums of a super-block (`first_block` its first block,
/// `d` and `−dmin` the pair's scales there) to its rows' outputs in `out`
/// (a pair's outputs for `n` rows, see [`load_row`]): the integers of
/// `packed_q4k`'s formula from the sums, then `pair_add_super` on the
/// outputs so far ([`so_far`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn add_tile<const SHIFT: u32>(
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    (t, first_block): (usize, usize),
    sums: &TileSums,
    rows: &[Q16Row<'_, SHIFT>],
    (d, neg_dmin): (__m512, __m512),
) {
    use super::vnni_packed_q4k::pair_add_super;
    let shift = _mm_cvtsi32_si128(SHIFT as i32);
    for (r, x) in rows.iter().enumerate() {
        let hi = byte_pair_sums(sums, 0, r);
        let (lo, mins) = if SHIFT == BYTE {
            (_mm512_setzero_si512(), row_sums(sums, (0, 2), r))
        } else {
            let (hi_mins, lo_mins) = (row_sums(sums, (0, 2), r), row_sums(sums, (1, 2), r));
            let mins = _mm512_add_epi32(_mm512_sll_epi32(hi_mins, shift), lo_mins);
            (byte_pair_sums(sums, 1, r), mins)
        };
        let row = TILE_ROWS * t + r;
        let acc = so_far(out, n, row, first_block);
        let acc = pair_add_super::<SHIFT>(acc, (d, neg_dmin), (hi, lo, mins), x.d[first_block]);
        store_row(out, n, row, acc);
    }
}

/// Row `t`'s outputs before the super-block whose first block is
/// `first_block`: zero for the first, else what [`load_row`] reads.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn so_far(out: &[[f32; GROUP_ROWS]], n: usize, t: usize, first_block: usize) -> __m512 {
    if first_block == 0 {
        _mm512_setzero_ps()
    } else {
        load_row(out, n, t)
    }
}

/// Row `t`'s outputs so far in a pair's outputs `out` for `n` rows: the
/// first group's eight at `out[t]` (lanes 0..8), the second's at
/// `out[n + t]`.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_row(out: &[[f32; GROUP_ROWS]], n: usize, t: usize) -> __m512 {
    let (a, b) = (&out[t], &out[n + t]);
    // SAFETY: `a` and `b` are eight floats each and `loadu` has no
    // alignment requirement.
    let (a, b) = unsafe { (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr())) };
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
    ))
}

/// Stores row `t`'s outputs `acc` where [`load_row`] reads them.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn store_row(out: &mut [[f32; GROUP_ROWS]], n: usize, t: usize, acc: __m512) {
    use super::avx2::store;
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    store(&mut out[t], lo);
    store(&mut out[n + t], hi);
}

/// Defines `pairs::<SHIFT>`, the outputs of each pair of consecutive
/// groups in `groups` (of `group_bytes` each, in a K-quant layout with
/// packed Q4_K's header and the sub-block bits `$bits`, whose values two
/// groups give through `$pair_values`) for the row tiles `rows`:
/// `out[2n·p + t]` and `out[2n·p + n + t]` for pair `p` and row `t`.
macro_rules! kquant_amx_pairs {
    ($bits:ty, $pair_values:path) => {
        use $crate::cpu::kernels::packed::GROUP_ROWS;
        use $crate::cpu::kernels::simd::amx::{FullTiles, TILE_ROWS};
        use $crate::cpu::kernels::simd::amx_kquant::*;

        /// The products of every pair in `groups` with `rows` (see the
        /// macro), on the configured `tiles`: super-block by super-block,
        /// so that each one's activation blocks serve every pair while
        /// they are in cache, each pair's scales folded into it once for
        /// all the row tiles, and the outputs summed where they go.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) fn pairs<const SHIFT: u32>(
            tiles: &FullTiles,
            groups: &[u8],
            group_bytes: usize,
            rows: &RowTiles<'_, '_, SHIFT>,
            (out, n): (&mut [[f32; GROUP_ROWS]], usize),
        ) {
            use $crate::cpu::kernels::packed_q4k::{
                SubBlockBits, BITS_AT, MINS_AT, SCALES_AT, SUB_BLOCKS,
            };
            use $crate::cpu::kernels::simd::vnni_packed::f16x16;
            use $crate::cpu::kernels::simd::vnni_packed_q4k::pair_neg_dmin;
            const BLOCK_BITS: usize = <$bits as SubBlockBits>::BLOCK_BITS;
            const SUPER_BYTES: usize = <$bits as SubBlockBits>::SUPER_BYTES;
            let mut folded = Folded::<PLANES>::new();
            let mut sums = TileSums::<PLANES>::new();
            for s in 0..rows.supers() {
                let pairs = groups.chunks_exact(2 * group_bytes);
                for (pair, out) in pairs.zip(out.chunks_exact_mut(2 * n)) {
                    let (a, b) = pair.split_at(group_bytes);
                    let sa = &a[s * SUPER_BYTES..][..SUPER_BYTES];
                    let sb = &b[s * SUPER_BYTES..][..SUPER_BYTES];
                    for j in 0..SUB_BLOCKS {
                        let at = BITS_AT + BLOCK_BITS * j;
                        let values = $pair_values(&sa[at..], &sb[at..]);
                        let (sc_at, m_at) = (SCALES_AT + GROUP_ROWS * j, MINS_AT + GROUP_ROWS * j);
                        let scales = (
                            per_lane(&sa[sc_at..], &sb[sc_at..]),
                            per_lane(&sa[m_at..], &sb[m_at..]),
                        );
                        fold_sub_block(&mut folded, j, values, scales);
                    }
                    let scales = (f16x16(&sa[..16], &sb[..16]), pair_neg_dmin(sa, sb));
                    for t in 0..rows.tiles() {
                        let folded = (&folded, plane_products as PlaneProducts<PLANES>);
                        tile_products::<SHIFT, PLANES>(tiles, rows, (t, s), folded, &mut sums);
                        let tile_rows = &rows.rows()[TILE_ROWS * t..][..TILE_ROWS];
                        let at = (t, s * SUB_BLOCKS);
                        add_tile::<SHIFT>((&mut *out, n), at, &sums, tile_rows, scales);
                    }
                }
            }
        }
    };
}

/// Q4_K's sub-blocks.
pub(crate) mod q4k {
    kquant_amx_pairs!(
        crate::cpu::kernels::packed_q4k::Nibbles,
        crate::cpu::kernels::simd::amx_packed::nibble_pair_values
    );
}

/// Q5_K's sub-blocks.
pub(crate) mod q5k {
    kquant_amx_pairs!(
        crate::cpu::kernels::packed_q5k::FiveBits,
        crate::cpu::kernels::simd::vnni_packed_q5::pair_values
    );
}
