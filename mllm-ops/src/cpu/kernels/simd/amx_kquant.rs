//! AMX products of packed Q4_K and Q5_K row-group pairs (see `packed_q4k`)
//! with up to [`MAX_TILES`] tiles of 16 activation rows.
//!
//! A tile product sums over 64 columns, two sub-blocks with scales of
//! their own; so the scales go into the weights before it. Per
//! super-block and group pair, each 6- or 5-bit value `q` becomes
//! `sc·q` (below 2^11) split into its low and high bytes, two unsigned B
//! operands per 64 columns. Against one activation plane (the A operand,
//! read in place) the two products give `Σ x·low` and `Σ x·high` over the
//! whole super-block in two tile registers, and `256·high + low` is then
//! `Σ_j sc_j·Σ q·x`. The minimums' term `Σ_j m_j·Σ q_x` takes no tile
//! product: the rows' exact block sums ([`MinWords`]) meet the pair's
//! minimums in four `vpdpwssd` per row, and two `vpdpbusd` more for
//! 16-bit rows (`kquant_mins::row_mins`). These are the integers of
//! `packed_q4k`'s formula, exact, which the float step
//! `vnni_packed_q4k::pair_add_super` turns into the bits of the AVX-512
//! kernels.
//!
//! The tile loads, not the products, bound these kernels: on a Sapphire
//! Rapids class Xeon a 1 KiB `tileloadd` from L1 took about 7 ns where a
//! `tdpbsud` takes 5.4, and a tile product overlaps the next loads. So
//! [`Products::quad`] multiplies two A operands (a 16-bit tile's two
//! planes, or two tiles of 8-bit rows) by the two B operands of a chunk,
//! four products from four loads.
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

use super::amx::{self, even_stride, FullTiles, TILE_ROWS};
use super::kquant_mins::{min_sum_words, row_mins, MinSumWords, MinWeights};
use crate::cpu::kernels::packed::{PackedFormat, GROUP_ROWS};
use crate::cpu::kernels::qact::{Q16Row, BYTE, SUPER_BLOCK};

/// Columns per tile product: a full tile row of bytes.
pub(crate) const CHUNK: usize = 64;
/// Tile products per super-block and operand.
pub(crate) const CHUNKS: usize = SUPER_BLOCK / CHUNK;
/// Bytes of one B operand: 16 rows of four columns of 16 weight rows.
pub(crate) const OPERAND: usize = TILE_ROWS * CHUNK;
/// Operands per chunk: the low bytes of the folded weights, their high
/// bytes.
pub(crate) const PLANES: usize = 2;
/// Most tiles of activation rows per call.
pub(crate) const MAX_TILES: usize = 8;

/// One super-block of a group pair as [`PLANES`] B operands per chunk,
/// chunk after chunk.
#[repr(C, align(64))]
pub(crate) struct Folded(pub(crate) [[[u8; OPERAND]; PLANES]; CHUNKS]);

impl Folded {
    /// Operands of zeros, for a kernel's folding to fill.
    pub(crate) fn new() -> Self {
        Folded([[[0; OPERAND]; PLANES]; CHUNKS])
    }
}

/// The sums of two A operands (a tile's high and low planes, or two
/// tiles' high planes) with a super-block's operands.
#[repr(C, align(64))]
pub(crate) struct TileSums(pub(crate) [PlaneSums; 2]);

impl TileSums {
    /// Zero sums, for a kernel's tile products to fill.
    pub(crate) fn new() -> Self {
        TileSums([[[[0; TILE_ROWS]; TILE_ROWS]; PLANES]; 2])
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

    /// Asks for the first cache line at column `col` of each of tile
    /// `t`'s 16 rows in the L1 cache, in both planes: for the tile after
    /// the one being multiplied (see [`each_tile`]).
    #[inline(always)]
    fn first_lines_into_l1(&self, t: usize, col: usize) {
        for plane in [false, true] {
            let first = self.plane_at(t, plane, col);
            for r in 0..TILE_ROWS {
                let line = first.wrapping_add(r.wrapping_mul(self.stride));
                // SAFETY: SSE is part of every x86-64 CPU, and a prefetch
                // only hints the cache: it never faults and reads nothing
                // into the program, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line) };
            }
        }
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
/// `kernel`: `amx::tiles_then_rest` with the whole tiles of the rows `xs`
/// (whose quantized rows are `rows`) as [`RowTiles`] on [`FullTiles`],
/// the rows after them (fewer than a tile) through the AVX-512 kernel;
/// `false` (nothing written) when there is no whole tile or the rows are
/// not tile rows ([`RowTiles::new`]).
///
/// # Safety
/// The CPU has the AVX-512 level's features and AMX tiles this process may
/// use (`amx::tiles_available`).
pub(crate) unsafe fn full_tiles_then_rest<F: PackedFormat, const SHIFT: u32>(
    (groups, group_bytes): (&[u8], usize),
    (xs, rows): (&[F::Input<'_>], &[Q16Row<'_, SHIFT>]),
    out: &mut [[f32; GROUP_ROWS]],
    kernel: TileKernel<SHIFT>,
) -> bool {
    let on_tiles = |tiled: &[Q16Row<'_, SHIFT>], out: (&mut [[f32; GROUP_ROWS]], usize)| {
        let Some(tile_rows) = RowTiles::new(tiled) else {
            return false;
        };
        // SAFETY: the caller guarantees AMX and the permission to use it.
        let tiles = unsafe { FullTiles::new() };
        // SAFETY: the caller guarantees the features, and `tiles` lives
        // across the call.
        unsafe { kernel(&tiles, groups, group_bytes, &tile_rows, out) };
        true
    };
    // SAFETY: the caller guarantees the features.
    unsafe { amx::tiles_then_rest::<F, SHIFT>((groups, group_bytes), (xs, rows), out, on_tiles) }
}

/// The sums of one A operand with a super-block's two operands (low and
/// high bytes): 16 activation rows of 16 weight rows' sums each.
pub(crate) type PlaneSums = [[[i32; TILE_ROWS]; TILE_ROWS]; PLANES];

/// The tile products of one and of two A operands with a folded
/// super-block, for high bytes of one signedness (the low bytes are
/// unsigned).
pub(crate) trait Products {
    /// Makes the tile products of one activation plane of 16 rows (row
    /// 0's first column of a super-block at `a`, the rows `stride` bytes
    /// apart) with a folded super-block, and stores them into `sums`.
    ///
    /// # Safety
    /// `tiles` holds the configuration, and each of the 16 rows has the
    /// 256 bytes from `row 0 + t·stride` readable.
    unsafe fn plane(
        tiles: &FullTiles,
        a: *const i8,
        stride: usize,
        folded: &Folded,
        sums: &mut PlaneSums,
    );

    /// Makes the tile products of two activation planes of 16 rows each
    /// (row 0's first column of a super-block at `a0` and at `a1`, the
    /// rows of both `stride` bytes apart) with a folded super-block, and
    /// stores them into `sums` (`a0`'s, then `a1`'s): per chunk four
    /// products from four tile loads.
    ///
    /// # Safety
    /// `tiles` holds the configuration, and each of the 16 rows of both
    /// planes has the 256 bytes from `row 0 + t·stride` readable.
    unsafe fn quad(
        tiles: &FullTiles,
        planes: (*const i8, *const i8),
        stride: usize,
        folded: &Folded,
        sums: &mut TileSums,
    );
}

/// Unsigned high bytes (`tdpbsud`): Q4_K's and Q5_K's folded weights.
pub(crate) struct UnsignedHigh;

/// Signed high bytes (`tdpbssd`): Q6_K's folded weights.
pub(crate) struct SignedHigh;

/// Implements [`Products`] for `$name` with the high-byte product
/// `$high`.
macro_rules! two_operand_products {
    ($name:ident, $high:literal) => {
        impl Products for $name {
            // SAFETY: the contract is `Products::plane`'s.
            #[inline(always)]
            unsafe fn plane(
                _tiles: &FullTiles,
                a: *const i8,
                stride: usize,
                folded: &Folded,
                sums: &mut PlaneSums,
            ) {
                // SAFETY: the registers are configured (`FullTiles`) with 16
                // rows of 64 bytes; each A load reads 64 bytes of each of the
                // 16 rows (the caller's guarantee), each B load one 1 KiB
                // operand of `folded`, and the stores write 1 KiB of `sums`
                // each.
                unsafe {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    for (c, operands) in folded.0.iter().enumerate() {
                        asm!(
                            "tileloadd tmm4, [{a} + {stride}*1]",
                            "tileloadd tmm6, [{low} + {row}*1]",
                            "tileloadd tmm7, [{high} + {row}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            concat!($high, " tmm1, tmm4, tmm7"),
                            a = in(reg) a.wrapping_add(CHUNK * c),
                            stride = in(reg) stride,
                            low = in(reg) operands[0].as_ptr(),
                            high = in(reg) operands[1].as_ptr(),
                            row = in(reg) CHUNK,
                            options(nostack, readonly),
                        );
                    }
                    let [low, high] = sums;
                    asm!(
                        "tilestored [{low} + {row}*1], tmm0",
                        "tilestored [{high} + {row}*1], tmm1",
                        low = in(reg) low.as_mut_ptr(),
                        high = in(reg) high.as_mut_ptr(),
                        row = in(reg) 4 * TILE_ROWS,
                        options(nostack),
                    );
                }
            }

            // SAFETY: the contract is `Products::quad`'s.
            #[inline(always)]
            unsafe fn quad(
                _tiles: &FullTiles,
                (a0, a1): (*const i8, *const i8),
                stride: usize,
                folded: &Folded,
                sums: &mut TileSums,
            ) {
                // SAFETY: as in the one-plane products, for both planes.
                unsafe {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                    for (c, operands) in folded.0.iter().enumerate() {
                        asm!(
                            "tileloadd tmm4, [{a0} + {stride}*1]",
                            "tileloadd tmm6, [{low} + {row}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            "tileloadd tmm5, [{a1} + {stride}*1]",
                            "tdpbsud tmm2, tmm5, tmm6",
                            "tileloadd tmm7, [{high} + {row}*1]",
                            concat!($high, " tmm1, tmm4, tmm7"),
                            concat!($high, " tmm3, tmm5, tmm7"),
                            a0 = in(reg) a0.wrapping_add(CHUNK * c),
                            a1 = in(reg) a1.wrapping_add(CHUNK * c),
                            stride = in(reg) stride,
                            low = in(reg) operands[0].as_ptr(),
                            high = in(reg) operands[1].as_ptr(),
                            row = in(reg) CHUNK,
                            options(nostack, readonly),
                        );
                    }
                    let [[s0, s1], [s2, s3]] = &mut sums.0;
                    asm!(
                        "tilestored [{s0} + {row}*1], tmm0",
                        "tilestored [{s1} + {row}*1], tmm1",
                        "tilestored [{s2} + {row}*1], tmm2",
                        "tilestored [{s3} + {row}*1], tmm3",
                        s0 = in(reg) s0.as_mut_ptr(),
                        s1 = in(reg) s1.as_mut_ptr(),
                        s2 = in(reg) s2.as_mut_ptr(),
                        s3 = in(reg) s3.as_mut_ptr(),
                        row = in(reg) 4 * TILE_ROWS,
                        options(nostack),
                    );
                }
            }
        }
    };
}

two_operand_products!(UnsignedHigh, "tdpbsud");
two_operand_products!(SignedHigh, "tdpbssd");

/// The tile products of every row tile of `rows` with super-block `s`,
/// folded in `folded`, by `P`'s products: `add(t, high, low)` gets tile `t`'s
/// sums of its high plane and (unless `SHIFT` is [`BYTE`]) of its low
/// one. 16-bit rows take a tile's two planes at once, 8-bit rows two
/// tiles at once (an odd last tile alone).
///
/// A call's row tiles outgrow L1 (8 KiB per tile and super-block with
/// 16-bit rows), so each tile's activations come from L2, and its first
/// tile loads waited for them: 18 % of the Q4_K kernel's samples in a
/// 1.1B Q4_K_M prefill. Before multiplying a tile, this asks for the first
/// line of each row of the next tile's planes (the first tile's, for the
/// next pair, after the last); the lines after it follow by the L1
/// prefetcher. On a Sapphire Rapids class Xeon the 1.1B Q4_K_M's prefill
/// of 512 tokens rose 1.5-3.7 % (medians of four sets of alternated
/// rounds), of 128 tokens 4.0 %, the 1.1B Q5_K_M's of 512 tokens 3.4 %;
/// asking for all four lines of each row lost 5.7 %. 8-bit rows (4 KiB
/// per tile) gained nothing from the same (0.991x) and go without.
#[inline(always)]
pub(crate) fn each_tile<P: Products, const SHIFT: u32>(
    tiles: &FullTiles,
    rows: &RowTiles<'_, '_, SHIFT>,
    s: usize,
    folded: &Folded,
    sums: &mut TileSums,
    mut add: impl FnMut(usize, &PlaneSums, Option<&PlaneSums>),
) {
    assert!(s < rows.supers(), "no such super-block");
    let (col, stride, count) = (s * SUPER_BLOCK, rows.stride, rows.tiles());
    // Each call below meets the products' contract: the tiles are
    // configured while `tiles` lives; every tile named is below
    // `rows.tiles()`, so its 16 rows exist, lie one stride apart in both
    // planes (`RowTiles::new`) and hold `supers()` whole super-blocks, so
    // the 256 bytes from column `256·s` (`s` in range, checked above) of
    // each are its own.
    if SHIFT != BYTE {
        for t in 0..count {
            rows.first_lines_into_l1((t + 1) % count, col);
            let planes = (rows.plane_at(t, false, col), rows.plane_at(t, true, col));
            // SAFETY: see above; tile `t < count`.
            unsafe { P::quad(tiles, planes, stride, folded, sums) };
            add(t, &sums.0[0], Some(&sums.0[1]));
        }
        return;
    }
    for t in (0..count).step_by(2) {
        if t + 1 < count {
            let planes = (
                rows.plane_at(t, false, col),
                rows.plane_at(t + 1, false, col),
            );
            // SAFETY: see above; tiles `t` and `t + 1 < count`.
            unsafe { P::quad(tiles, planes, stride, folded, sums) };
            add(t, &sums.0[0], None);
            add(t + 1, &sums.0[1], None);
        } else {
            let plane = rows.plane_at(t, false, col);
            // SAFETY: see above; tile `t < count`.
            unsafe { P::plane(tiles, plane, stride, folded, &mut sums.0[0]) };
            add(t, &sums.0[0], None);
        }
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

/// The bytes of `sc` at even places and at odd places, the others
/// zeroed: as the signed operands of two `maddubs`, they put each byte of
/// the other operand times its scale into its own 16-bit lane (the even
/// bytes' products with the first, the odd bytes' with the second), for
/// [`low_and_high_bytes`] to put back into byte order.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn scales_by_parity(sc: __m512i) -> (__m512i, __m512i) {
    let low_byte = _mm512_set1_epi16(0x00FF);
    (
        _mm512_and_si512(sc, low_byte),
        _mm512_andnot_si512(low_byte, sc),
    )
}

/// The low and the high bytes of 16-bit products in byte order: `even`
/// holds the products of a vector's even bytes, `odd` those of its odd
/// bytes, one per 16-bit lane (see [`scales_by_parity`]).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(crate) fn low_and_high_bytes(even: __m512i, odd: __m512i) -> (__m512i, __m512i) {
    let odd_bytes: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
    (
        _mm512_mask_blend_epi8(odd_bytes, even, _mm512_slli_epi16::<8>(odd)),
        _mm512_mask_blend_epi8(odd_bytes, _mm512_srli_epi16::<8>(even), odd),
    )
}

/// Folds one sub-block of a pair into its eight B operand rows of
/// `folded` (rows `8·(j mod 2)..` of chunk `j / 2`): its values `values`
/// (four columns of 16 weight rows per vector, as `amx_packed`'s
/// `set_chunk_values` takes them), each times its row's scale (`sc`, per
/// lane as [`per_lane`] gives it) split into low and high bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn fold_sub_block(
    folded: &mut Folded,
    j: usize,
    values: [[__m512i; 2]; 4],
    sc: __m512i,
) {
    let (sc_even, sc_odd) = scales_by_parity(sc);
    let [[l0, h0], [l1, h1], [l2, h2], [l3, h3]] = values;
    let operands = &mut folded.0[j / 2];
    for (k, v) in [l0, l1, l2, l3, h0, h1, h2, h3].into_iter().enumerate() {
        let (even, odd) = (
            _mm512_maddubs_epi16(v, sc_even),
            _mm512_maddubs_epi16(v, sc_odd),
        );
        let (low, high) = low_and_high_bytes(even, odd);
        let at = CHUNK * (8 * (j % 2) + k);
        for (plane, v) in [low, high].into_iter().enumerate() {
            let row = &mut operands[plane][at..at + CHUNK];
            // SAFETY: `row` is 64 bytes (sliced above) and `storeu` has no
            // alignment requirement.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), v) };
        }
    }
}

/// Activation row `r`'s 16 sums of operand `op` in one A operand's sums.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn row_sums(sums: &PlaneSums, op: usize, r: usize) -> __m512i {
    let row = &sums[op][r];
    // SAFETY: `row` is 16 `i32` (64 bytes) and `loadu` has no alignment
    // requirement.
    unsafe { _mm512_loadu_si512(row.as_ptr().cast()) }
}

/// Activation row `r`'s `256·high + low` in one A operand's sums whose
/// operands 0 and 1 hold the low and the high bytes of the folded
/// weights: the sums of the weights themselves.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn byte_pair_sums(sums: &PlaneSums, r: usize) -> __m512i {
    let (low, high) = (row_sums(sums, 0, r), row_sums(sums, 1, r));
    _mm512_add_epi32(_mm512_slli_epi32::<8>(high), low)
}

/// Every row's [`MinSumWords`] of one super-block, for a call's row
/// tiles.
#[repr(C, align(64))]
pub(crate) struct MinWords([MinSumWords; MAX_TILES * TILE_ROWS]);

impl MinWords {
    /// Words of zeros, for [`MinWords::set`] to fill.
    pub(crate) fn new() -> Self {
        MinWords([[0; 8]; MAX_TILES * TILE_ROWS])
    }

    /// Sets the words of every row of `rows` (at most
    /// `MAX_TILES · TILE_ROWS` of them) for super-block `s`.
    #[target_feature(enable = "avx2,avx512f,avx512vl")]
    pub(crate) fn set<const SHIFT: u32>(&mut self, rows: &[Q16Row<'_, SHIFT>], s: usize) {
        assert!(rows.len() <= self.0.len(), "more rows than tiles");
        for (words, x) in self.0.iter_mut().zip(rows) {
            *words = min_sum_words(x, s);
        }
    }

    /// The words of tile `t`'s rows.
    pub(crate) fn tile(&self, t: usize) -> &[MinSumWords; TILE_ROWS] {
        let words = &self.0[TILE_ROWS * t..][..TILE_ROWS];
        words.try_into().expect("a tile's rows")
    }
}

/// Each row's activation scale of one super-block, in row order, for
/// the float steps: one array, where each row's own scales took a load of
/// their address and a bounds check in every row's step.
#[repr(C, align(64))]
pub(crate) struct RowScales([f32; MAX_TILES * TILE_ROWS]);

impl RowScales {
    /// Zero scales, for [`RowScales::set`] to fill.
    pub(crate) fn new() -> Self {
        RowScales([0.0; MAX_TILES * TILE_ROWS])
    }

    /// Sets the scales of every row of `rows` (at most
    /// `MAX_TILES · TILE_ROWS` of them) for the super-block whose first
    /// block is `first_block`.
    pub(crate) fn set<const SHIFT: u32>(&mut self, rows: &[Q16Row<'_, SHIFT>], first_block: usize) {
        assert!(rows.len() <= self.0.len(), "more rows than tiles");
        for (dx, x) in self.0.iter_mut().zip(rows) {
            *dx = x.d[first_block];
        }
    }

    /// The scales of tile `t`'s rows.
    pub(crate) fn tile(&self, t: usize) -> &[f32; TILE_ROWS] {
        let scales = &self.0[TILE_ROWS * t..][..TILE_ROWS];
        scales.try_into().expect("a tile's rows")
    }
}

/// Adds tile `t`'s sums of a super-block (`first_block` its first block,
/// `d` and `−dmin` the pair's scales there, `mins` its [`MinWeights`]) to
/// its rows' outputs in `out` (a pair's outputs for `n` rows, see
/// [`TileOutputs`]): the integers of `packed_q4k`'s formula from the sums of
/// the high plane `hi` and the low one `lo` (none for [`BYTE`] rows) and
/// the rows' [`MinWords`] `words`, then `pair_add_super` with the rows'
/// scales `dx` on the outputs so far.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
pub(crate) fn add_tile<const SHIFT: u32>(
    (out, n): (&mut [[f32; GROUP_ROWS]], usize),
    (t, first_block): (usize, usize),
    (hi, lo): (&PlaneSums, Option<&PlaneSums>),
    (words, dx): (&[MinSumWords; TILE_ROWS], &[f32; TILE_ROWS]),
    (d, neg_dmin): (__m512, __m512),
    mins: &MinWeights,
) {
    use super::vnni_packed_q4k::pair_add_super;
    let mut outputs = TileOutputs::new(out, n, t);
    for (r, (words, &dx)) in words.iter().zip(dx).enumerate() {
        let sum_hi = byte_pair_sums(hi, r);
        let sum_lo = lo.map_or(_mm512_setzero_si512(), |lo| byte_pair_sums(lo, r));
        let row_mins = row_mins::<SHIFT>(mins, words);
        let acc = outputs.so_far(r, first_block);
        let sums = (sum_hi, sum_lo, row_mins);
        let acc = pair_add_super::<SHIFT>(acc, (d, neg_dmin), sums, dx);
        outputs.store(r, acc);
    }
}

/// Row tile `t`'s outputs in a pair's outputs `out` for `n` rows: row
/// `16t + r`'s outputs of the first group are `out[16t + r]`, those of the
/// second `out[n + 16t + r]`; held as two arrays of the tile's 16 rows,
/// so that the float steps need no bounds checks.
pub(crate) struct TileOutputs<'o> {
    first: &'o mut [[f32; GROUP_ROWS]; TILE_ROWS],
    second: &'o mut [[f32; GROUP_ROWS]; TILE_ROWS],
}

impl<'o> TileOutputs<'o> {
    /// Tile `t`'s outputs in `out`.
    pub(crate) fn new(out: &'o mut [[f32; GROUP_ROWS]], n: usize, t: usize) -> Self {
        let (first, second) = out.split_at_mut(n);
        let tile = |rows: &'o mut [[f32; GROUP_ROWS]]| {
            let rows = &mut rows[TILE_ROWS * t..][..TILE_ROWS];
            <&mut [[f32; GROUP_ROWS]; TILE_ROWS]>::try_from(rows).expect("a tile's rows")
        };
        TileOutputs {
            first: tile(first),
            second: tile(second),
        }
    }

    /// Row `r`'s outputs before the super-block or span whose first block
    /// is `first_block` (zero for the first), both groups' as one vector:
    /// the first group's in lanes 0..8.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn so_far(&self, r: usize, first_block: usize) -> __m512 {
        if first_block == 0 {
            return _mm512_setzero_ps();
        }
        let (a, b) = (&self.first[r], &self.second[r]);
        // SAFETY: `a` and `b` are eight floats each and `loadu` has no
        // alignment requirement.
        let (a, b) = unsafe { (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr())) };
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(a)),
            _mm256_castps_pd(b),
        ))
    }

    /// Stores row `r`'s outputs `acc` where [`TileOutputs::so_far`] reads
    /// them.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn store(&mut self, r: usize, acc: __m512) {
        let (a, b) = (&mut self.first[r], &mut self.second[r]);
        // SAFETY: `a` and `b` are eight floats each and `storeu` has no
        // alignment requirement.
        unsafe {
            _mm256_storeu_ps(a.as_mut_ptr(), _mm512_castps512_ps256(acc));
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc));
            _mm256_storeu_ps(b.as_mut_ptr(), _mm256_castpd_ps(high));
        }
    }
}

/// Defines `pairs::<SHIFT>`, the outputs of each pair of consecutive
/// groups in `groups` (of `group_bytes` each, in a K-quant layout with
/// packed Q4_K's header and the sub-block bits `$bits`, whose values two
/// groups give through `$pair_values`) for the row tiles `rows`:
/// `out[2n·p + t]` and `out[2n·p + n + t]` for pair `p` and row `t`.
macro_rules! kquant_amx_pairs {
    ($bits:ty, $pair_values:path) => {
        use $crate::cpu::kernels::packed::GROUP_ROWS;
        use $crate::cpu::kernels::simd::amx::{next_piece_into_l2, FullTiles};
        use $crate::cpu::kernels::simd::amx_kquant::*;
        use $crate::cpu::kernels::simd::kquant_mins::MinWeights;

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
            let mut folded = Folded::new();
            let mut sums = TileSums::new();
            let mut words = MinWords::new();
            let mut dx = RowScales::new();
            for s in 0..rows.supers() {
                words.set(rows.rows(), s);
                dx.set(rows.rows(), s * SUB_BLOCKS);
                let pairs = groups.chunks_exact(2 * group_bytes);
                for (p, (pair, out)) in pairs.zip(out.chunks_exact_mut(2 * n)).enumerate() {
                    next_piece_into_l2(groups, group_bytes, (p, s), SUPER_BYTES);
                    let (a, b) = pair.split_at(group_bytes);
                    let sa = &a[s * SUPER_BYTES..][..SUPER_BYTES];
                    let sb = &b[s * SUPER_BYTES..][..SUPER_BYTES];
                    for j in 0..SUB_BLOCKS {
                        let at = BITS_AT + BLOCK_BITS * j;
                        let values = $pair_values(&sa[at..], &sb[at..]);
                        let sc_at = SCALES_AT + GROUP_ROWS * j;
                        fold_sub_block(
                            &mut folded,
                            j,
                            values,
                            per_lane(&sa[sc_at..], &sb[sc_at..]),
                        );
                    }
                    let scales = (f16x16(&sa[..16], &sb[..16]), pair_neg_dmin(sa, sb));
                    let mins = MinWeights::new::<SHIFT>(sa, sb, MINS_AT);
                    each_tile::<UnsignedHigh, SHIFT>(
                        tiles,
                        rows,
                        s,
                        &folded,
                        &mut sums,
                        |t, hi, lo| {
                            let at = (t, s * SUB_BLOCKS);
                            let x = (words.tile(t), dx.tile(t));
                            add_tile::<SHIFT>((&mut *out, n), at, (hi, lo), x, scales, &mins);
                        },
                    );
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
