//! AMX tile products for the packed prefill kernels: the block sums of 16
//! activation rows against two packed row groups (16 weight rows) in one
//! `tdpbsud` per activation plane, instead of 64 `vpdpbusd`.
//!
//! A packed group pair's block is already a tile operand: chunk `j` of
//! both groups' bits (joined into 512-bit vectors, as `vnni_packed` does)
//! holds, for each of the 16 weight rows, the four values at columns
//! `4j..4j + 4` (low nibbles) and `16 + 4j..` (high nibbles), which is row
//! `j` (and `4 + j`) of the B operand in AMX's four-bytes-per-column
//! layout. The A operand is one block of 16 activation rows of one plane,
//! read in place with the rows' stride. The integer sums are those of the
//! `vpdpbusd` kernels (exact in 32 bits), so the float steps after them
//! give the AVX-512 kernels' bits.
//!
//! Tiles are per thread and need the kernel's permission, asked for once
//! per process by [`tiles_available`]. A kernel loads its tile
//! configuration at the start of each call and releases the tiles before
//! it returns ([`Tiles`]), so no tile state outlives a call.

use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::cpu::kernels::packed::{vnni_pair_in_chunks, PackedFormat, WeightReads, GROUP_ROWS};
use crate::cpu::kernels::qact::{Q16Row, BLOCK, BYTE};

/// Activation rows per tile product: the most rows an AMX tile holds.
pub(crate) const TILE_ROWS: usize = 16;

/// Bytes of a B operand: one block's 32 values of 16 weight rows.
const B_BYTES: usize = TILE_ROWS * BLOCK;

/// Bytes per row of a C tile: 16 weight rows' 32-bit sums.
const C_ROW_BYTES: usize = TILE_ROWS * 4;

/// Linux's `arch_prctl` request for permission to use an extended state
/// component, and the component of the AMX tile data.
#[cfg(target_os = "linux")]
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
#[cfg(target_os = "linux")]
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether this CPU has AMX tiles with 8-bit products and the kernel lets
/// this process use them (asking for the permission, which Linux wants
/// before the first tile instruction; asking again is harmless).
pub(crate) fn tiles_available() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    tile && int8 && tile_permission()
}

#[cfg(target_os = "linux")]
fn tile_permission() -> bool {
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` takes
    // two integers and touches no memory of ours; it fails cleanly on a
    // kernel without AMX support.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn tile_permission() -> bool {
    false
}

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile register.
    colsb: [u16; 16],
    /// Rows of each tile register.
    rows: [u8; 16],
}

impl TileConfig {
    /// Four sums of 16 × 16 `i32` (registers 0-3) and two full operands
    /// of 16 rows × 64 bytes (4 and 5): the peak loop's registers.
    fn peak() -> TileConfig {
        TileConfig::of(&[(64, TILE_ROWS); 6])
    }

    /// Palette 1 with tile register `r` of `shapes[r].1` rows of
    /// `shapes[r].0` bytes, the others unused.
    fn of(shapes: &[(usize, usize)]) -> TileConfig {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        for (tile, &(bytes, height)) in shapes.iter().enumerate() {
            colsb[tile] = bytes as u16;
            rows[tile] = height as u8;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }
}

/// Byte products of one full-size `tdpbssd`: 16 × 16 sums over 64 bytes.
pub(crate) const PEAK_PRODUCTS: usize = TILE_ROWS * TILE_ROWS * 64;

/// Independent sums of the peak loop.
pub(crate) const PEAK_CHAINS: usize = 4;

/// `iters` rounds of [`PEAK_CHAINS`] full-size `tdpbssd` of bytes of one
/// (no memory traffic inside the loop), and the sum of all their sums:
/// `PEAK_PRODUCTS · PEAK_CHAINS · iters` (exact while `64·iters` fits an
/// `i32`, which `iters ≤ 2^20` keeps).
///
/// # Safety
/// [`tiles_available`] returned true in this process.
pub(crate) unsafe fn byte_dot_peak(iters: usize) -> f64 {
    let config = TileConfig::peak();
    let ones = [1u8; TILE_ROWS * 64];
    let mut sums = [[[0i32; TILE_ROWS]; TILE_ROWS]; PEAK_CHAINS];
    // SAFETY: the caller guarantees AMX and the permission to use it; the
    // configuration gives registers 0-5 16 rows of 64 bytes, the loads
    // read the 1 KiB of `ones` and the stores write 1 KiB of `sums` each.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{ones} + {row}*1]",
            "tileloadd tmm5, [{ones} + {row}*1]",
            ones = in(reg) ones.as_ptr(),
            row = in(reg) 64usize,
            options(nostack, readonly),
        );
        for _ in 0..iters {
            asm!(
                "tdpbssd tmm0, tmm4, tmm5",
                "tdpbssd tmm1, tmm4, tmm5",
                "tdpbssd tmm2, tmm4, tmm5",
                "tdpbssd tmm3, tmm4, tmm5",
                options(nostack, nomem),
            );
        }
        asm!(
            "tilestored [{s0} + {row}*1], tmm0",
            "tilestored [{s1} + {row}*1], tmm1",
            "tilestored [{s2} + {row}*1], tmm2",
            "tilestored [{s3} + {row}*1], tmm3",
            "tilerelease",
            s0 = in(reg) sums[0].as_mut_ptr(),
            s1 = in(reg) sums[1].as_mut_ptr(),
            s2 = in(reg) sums[2].as_mut_ptr(),
            s3 = in(reg) sums[3].as_mut_ptr(),
            row = in(reg) 64usize,
            options(nostack),
        );
    }
    sums.iter().flatten().flatten().map(|&v| v as f64).sum()
}

/// Blocks whose tile products one [`Tiles::products`] call makes one
/// after the other, before the float steps read any of them: the products
/// of one block then overlap the stores and loads of the others instead
/// of waiting for them.
pub(crate) const SPAN: usize = 8;

/// The shape of each tile register the kernels use: `(bytes per row,
/// rows)`. Registers 0, 1, 6 and 7 hold sums (16 activation rows × 16
/// weight rows of `i32`), 2 and 3 activation blocks (16 rows × 32 bytes),
/// 4 and 5 weight blocks (8 rows of four values × 16 weight rows).
const SHAPES: [(usize, usize); 8] = [
    (C_ROW_BYTES, TILE_ROWS),
    (C_ROW_BYTES, TILE_ROWS),
    (BLOCK, TILE_ROWS),
    (BLOCK, TILE_ROWS),
    (4 * TILE_ROWS, BLOCK / 4),
    (4 * TILE_ROWS, BLOCK / 4),
    (C_ROW_BYTES, TILE_ROWS),
    (C_ROW_BYTES, TILE_ROWS),
];

impl TileConfig {
    /// The registers of [`SHAPES`].
    fn block_products() -> TileConfig {
        TileConfig::of(&SHAPES)
    }
}

/// The tile product `$op` (`tdpbsud`: signed activations times unsigned
/// weights, `tdpbssd`: both signed) of one sub-block into its sums, in the
/// registers `$c` (sums), `$a` (activations) and `$b` (weights).
macro_rules! tile_product {
    ($op:literal, $c:literal, $a:literal, $b:literal, $plane:expr, $stride:expr, $values:expr, $sums:expr) => {
        asm!(
            concat!("tilezero tmm", $c),
            concat!("tileloadd tmm", $a, ", [{a} + {stride}*1]"),
            concat!("tileloadd tmm", $b, ", [{b} + {row}*1]"),
            concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
            concat!("tilestored [{c} + {row}*1], tmm", $c),
            a = in(reg) $plane,
            stride = in(reg) $stride,
            b = in(reg) $values,
            c = in(reg) $sums,
            row = in(reg) C_ROW_BYTES,
            options(nostack),
        )
    };
}

/// The tile products `$op` of both planes of one sub-block with its
/// values, loaded once: the high plane (`$planes.0`) into the sums
/// `$sums.0`, the low plane (`$planes.1`) into `$sums.1`, in the registers
/// `$ch` and `$cl` (sums), 2 and 3 (activations) and `$b` (weights).
macro_rules! tile_plane_products {
    ($op:literal, $ch:literal, $cl:literal, $b:literal, $planes:expr, $stride:expr, $values:expr, $sums:expr) => {
        asm!(
            concat!("tilezero tmm", $ch),
            concat!("tilezero tmm", $cl),
            concat!("tileloadd tmm", $b, ", [{b} + {row}*1]"),
            "tileloadd tmm2, [{hi} + {stride}*1]",
            concat!($op, " tmm", $ch, ", tmm2, tmm", $b),
            "tileloadd tmm3, [{lo} + {stride}*1]",
            concat!($op, " tmm", $cl, ", tmm3, tmm", $b),
            concat!("tilestored [{c_hi} + {row}*1], tmm", $ch),
            concat!("tilestored [{c_lo} + {row}*1], tmm", $cl),
            hi = in(reg) $planes.0,
            lo = in(reg) $planes.1,
            stride = in(reg) $stride,
            b = in(reg) $values,
            c_hi = in(reg) $sums.0,
            c_lo = in(reg) $sums.1,
            row = in(reg) C_ROW_BYTES,
            options(nostack),
        )
    };
}

/// One span's sums of one plane: per sub-block, one row of 16 weight rows
/// per activation row.
type SpanSums = [[[i32; TILE_ROWS]; TILE_ROWS]; SPAN];

/// The buffers of one call's tile products, with the tiles configured
/// while it lives.
#[repr(C, align(64))]
pub(crate) struct Tiles {
    /// The B operands of the span's sub-blocks; only those set since `new`
    /// (bits of `set`) are read.
    b: MaybeUninit<[[u8; B_BYTES]; SPAN]>,
    /// The sums of the high planes; only those of the last `products`
    /// (`made`) are read.
    c_hi: MaybeUninit<SpanSums>,
    /// The same of the low planes.
    c_lo: MaybeUninit<SpanSums>,
    /// A bit for each sub-block whose values are set.
    set: u32,
    /// The sub-blocks of the last `products`, and whether it summed the
    /// low planes too.
    made: (usize, bool),
}

impl Tiles {
    /// Configures the tiles for block products.
    ///
    /// # Safety
    /// [`tiles_available`] returned true in this process.
    pub(crate) unsafe fn new() -> Tiles {
        let config = TileConfig::block_products();
        // SAFETY: the caller guarantees AMX and the permission to use it;
        // `ldtilecfg` reads the 64 bytes of `config`.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
        Tiles {
            b: MaybeUninit::uninit(),
            c_hi: MaybeUninit::uninit(),
            c_lo: MaybeUninit::uninit(),
            set: 0,
            made: (0, false),
        }
    }

    /// Sets sub-block `j`'s B operand from the eight 512-bit rows of a
    /// group pair's block values (see the module documentation): `rows[c]`
    /// the values at columns `4c..4c + 4`, `rows[4 + c]` those at
    /// `16 + 4c..`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn set_values(&mut self, j: usize, rows: [__m512i; 8]) {
        assert!(j < SPAN, "no such sub-block");
        let values = self.b.as_mut_ptr().cast::<[u8; B_BYTES]>();
        for (c, row) in rows.iter().enumerate() {
            // SAFETY: sub-block `j` (in range, checked above) is 512 bytes
            // of `b`, row `c < 8` its 64 bytes at `64·c`; `storeu` has no
            // alignment requirement.
            unsafe { _mm512_storeu_si512(values.add(j).cast::<u8>().add(64 * c).cast(), *row) };
        }
        self.set |= 1 << j;
    }

    /// The block sums of `rows` against the values of sub-blocks
    /// `0..count` (at activation blocks `first..first + count`): for
    /// sub-block `j`, `Σ_k hi[t][k]·w[r][k]` over its 32 columns, and the
    /// same of the low planes unless `SHIFT` is [`BYTE`]; the values are
    /// unsigned bytes, or signed ones with `signed`. Panics unless those
    /// values are set.
    pub(crate) fn products<const SHIFT: u32>(
        &mut self,
        rows: &TileRows<'_, SHIFT>,
        first: usize,
        count: usize,
        signed: bool,
    ) {
        let all = (1u32 << count.min(SPAN)) - 1;
        assert!(
            count <= SPAN && self.set & all == all,
            "tile product of values not set"
        );
        let stride = rows.stride;
        let values = self.b.as_ptr().cast::<[u8; B_BYTES]>();
        let c_hi = self
            .c_hi
            .as_mut_ptr()
            .cast::<[[i32; TILE_ROWS]; TILE_ROWS]>();
        let c_lo = self
            .c_lo
            .as_mut_ptr()
            .cast::<[[i32; TILE_ROWS]; TILE_ROWS]>();
        for j in 0..count {
            let at = BLOCK * (first + j);
            let hi = rows.first.hi[at..at + BLOCK].as_ptr();
            // SAFETY: the tiles are configured while `self` lives (`new`)
            // with the shapes of `SHAPES`; row `t`'s block of each plane
            // lies `t·stride` bytes after the first row's (checked in
            // `TileRows::new`) inside row `t`'s slice, which is at least
            // `at + BLOCK` long (every row has the first row's length,
            // also checked there); `b` is sub-block `j`'s 512 bytes, set
            // (checked above), and `c_hi` and `c_lo` its 1 KiB of sums
            // each (`j < count <= SPAN`).
            unsafe {
                let b = values.add(j).cast::<u8>();
                let (c_hi, c_lo) = (c_hi.add(j), c_lo.add(j));
                // Even and odd sub-blocks use different registers.
                macro_rules! planes {
                    ($op:literal) => {
                        match (SHIFT == BYTE, j % 2 == 0) {
                            (true, true) => tile_product!($op, "0", "2", "4", hi, stride, b, c_hi),
                            (true, false) => tile_product!($op, "1", "3", "5", hi, stride, b, c_hi),
                            (false, even) => {
                                let planes = (hi, rows.first.lo[at..at + BLOCK].as_ptr());
                                let sums = (c_hi, c_lo);
                                if even {
                                    tile_plane_products!(
                                        $op, "0", "1", "4", planes, stride, b, sums
                                    );
                                } else {
                                    tile_plane_products!(
                                        $op, "6", "7", "5", planes, stride, b, sums
                                    );
                                }
                            }
                        }
                    };
                }
                if signed {
                    planes!("tdpbssd")
                } else {
                    planes!("tdpbsud")
                }
            }
        }
        self.made = (count, SHIFT != BYTE);
    }

    /// Activation row `t`'s sums in sub-block `j` of the last products, as
    /// 16 lanes (one per weight row): high plane, low plane (zero for
    /// [`BYTE`] rows).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn sums<const SHIFT: u32>(&self, j: usize, t: usize) -> (__m512i, __m512i) {
        let (made, with_lo) = self.made;
        assert!(j < made && t < TILE_ROWS, "sums of a product not made");
        assert!(with_lo || SHIFT == BYTE, "sums of planes not multiplied");
        let c_hi = self.c_hi.as_ptr().cast::<[[i32; TILE_ROWS]; TILE_ROWS]>();
        let c_lo = self.c_lo.as_ptr().cast::<[[i32; TILE_ROWS]; TILE_ROWS]>();
        // SAFETY: the last `products` wrote all 16 rows of its sub-blocks
        // `0..made` (`j` among them, checked above) with `tilestored`, the
        // low planes' too where they are read (checked above); each row is
        // 16 `i32` (64 bytes) and `loadu` has no alignment requirement.
        unsafe {
            let hi = _mm512_loadu_si512((*c_hi.add(j))[t].as_ptr().cast());
            let lo = if SHIFT == BYTE {
                _mm512_setzero_si512()
            } else {
                _mm512_loadu_si512((*c_lo.add(j))[t].as_ptr().cast())
            };
            (hi, lo)
        }
    }
}

/// The tiles configured with all eight registers 16 rows of 64 bytes,
/// while it lives: the registers of the K-quant kernels (`amx_kquant`).
pub(crate) struct FullTiles(());

impl FullTiles {
    /// Configures the tiles.
    ///
    /// # Safety
    /// [`tiles_available`] returned true in this process.
    pub(crate) unsafe fn new() -> FullTiles {
        let config = TileConfig::of(&[(64, TILE_ROWS); 8]);
        // SAFETY: the caller guarantees AMX and the permission to use it;
        // `ldtilecfg` reads the 64 bytes of `config`.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
        FullTiles(())
    }
}

impl Drop for FullTiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured in `new`; `tilerelease`
        // returns them to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured in `new`; `tilerelease`
        // returns them to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// 16 activation rows that a tile product reads in place: rows of one
/// length whose planes lie one stride apart, as rows of one buffer do.
pub(crate) struct TileRows<'a, const SHIFT: u32> {
    first: Q16Row<'a, SHIFT>,
    /// Bytes from one row's planes to the next row's (as a two's
    /// complement `usize`: rows in reverse order have a negative stride,
    /// which the tile loads' 64-bit address arithmetic takes as it is).
    stride: usize,
    /// Each row's block scales and sums, `first.d.len()` of each.
    scales: [(&'a [f32], &'a [f32]); TILE_ROWS],
}

impl<'a, const SHIFT: u32> TileRows<'a, SHIFT> {
    /// `xs` as tile rows, or `None` unless it holds exactly 16 rows with
    /// one number of blocks whose high planes (and low ones, unless `SHIFT`
    /// is [`BYTE`], whose products skip them) lie one stride apart.
    pub(crate) fn new(xs: &[Q16Row<'a, SHIFT>]) -> Option<TileRows<'a, SHIFT>> {
        let rows: &[Q16Row<'a, SHIFT>; TILE_ROWS] = xs.try_into().ok()?;
        Some(TileRows {
            first: rows[0],
            stride: even_stride(rows)?,
            scales: std::array::from_fn(|t| (rows[t].d, rows[t].s)),
        })
    }

    /// Blocks of 32 columns in each row.
    pub(crate) fn blocks(&self) -> usize {
        self.first.d.len()
    }

    /// Row `t`'s scale `d` and sum `s` of block `i`.
    #[inline(always)]
    pub(crate) fn block_scale(&self, t: usize, i: usize) -> (f32, f32) {
        assert!(i < self.blocks(), "block outside the rows");
        let (d, s) = self.scales[t];
        // SAFETY: every row's scales and sums hold `blocks()` values
        // (checked in `new`), and `i < blocks()`, checked above.
        unsafe { (*d.get_unchecked(i), *s.get_unchecked(i)) }
    }
}

/// The stride of the rows `xs` (at least two) when they are rows of one
/// length and number of blocks of 32, whose high planes (and low ones,
/// unless `SHIFT` is [`BYTE`], whose products skip them) lie one stride
/// apart, as rows of one buffer do: as a two's complement `usize`, so
/// that rows in reverse order have a negative stride, which the tile
/// loads' 64-bit address arithmetic takes as it is.
pub(crate) fn even_stride<const SHIFT: u32>(xs: &[Q16Row<'_, SHIFT>]) -> Option<usize> {
    let (first, second) = (xs.first()?, xs.get(1)?);
    let (values, blocks) = (first.hi.len(), first.d.len());
    let address = |p: &[i8]| p.as_ptr() as usize;
    let stride = address(second.hi).wrapping_sub(address(first.hi));
    let spaced = |p: &[i8], p0: &[i8], t: usize| {
        address(p) == address(p0).wrapping_add(t.wrapping_mul(stride))
    };
    let evenly_spaced = xs.iter().enumerate().all(|(t, x)| {
        let lo_spaced = SHIFT == BYTE || (x.lo.len() == values && spaced(x.lo, first.lo, t));
        x.hi.len() == values
            && x.d.len() == blocks
            && x.s.len() == blocks
            && x.sums.len() == blocks
            && values == blocks * BLOCK
            && spaced(x.hi, first.hi, t)
            && lo_spaced
    });
    evenly_spaced.then_some(stride)
}

/// A tile kernel over many tiles of 16 rows (as
/// `amx_packed::pairs_by_spans`): the products of each group pair in
/// `groups` (of `group_bytes` each) with the row tiles, into `out` with `n`
/// rows per group (`out[2n·p + t]` and `out[2n·p + n + t]` for pair `p`
/// and row `t`), on tiles configured for block products.
///
/// # Safety
/// The CPU has the AVX-512 level's features, and the tiles are configured
/// while the `Tiles` lives.
pub(crate) type RowTilesKernel<const SHIFT: u32> = unsafe fn(
    &mut Tiles,
    (&[u8], usize),
    &[TileRows<'_, SHIFT>],
    (&mut [[f32; GROUP_ROWS]], usize),
);

/// `PackedFormat::amx_pairs` of a format whose tile kernel is `kernel`:
/// [`tiles_then_rest`] with each whole tile of `rows` as [`TileRows`], on
/// tiles configured for block products; `false` (nothing written) where
/// there is no whole tile or a tile's rows are not tile rows.
///
/// # Safety
/// The CPU has the AVX-512 level's features and AMX tiles this process may
/// use ([`tiles_available`]).
pub(crate) unsafe fn row_tiles_then_rest<F: PackedFormat, const SHIFT: u32>(
    groups: (&[u8], usize),
    (xs, rows): (&[F::Input<'_>], &[Q16Row<'_, SHIFT>]),
    out: &mut [[f32; GROUP_ROWS]],
    kernel: RowTilesKernel<SHIFT>,
) -> bool {
    let on_tiles = |tiled: &[Q16Row<'_, SHIFT>], out: (&mut [[f32; GROUP_ROWS]], usize)| {
        let row_tiles: Option<Vec<TileRows<'_, SHIFT>>> =
            tiled.chunks_exact(TILE_ROWS).map(TileRows::new).collect();
        let Some(row_tiles) = row_tiles else {
            return false;
        };
        // SAFETY: the caller guarantees AMX with the permission to use it.
        let mut tiles = unsafe { Tiles::new() };
        // SAFETY: the caller guarantees the features, and the tiles are
        // configured while `tiles` lives.
        unsafe { kernel(&mut tiles, groups, &row_tiles, out) };
        true
    };
    // SAFETY: the caller guarantees the features.
    unsafe { tiles_then_rest::<F, SHIFT>(groups, (xs, rows), out, on_tiles) }
}

/// The products of the rows `xs` (whose quantized rows are `rows`) with
/// each group pair in `groups` (of `group_bytes` each), into `out` as
/// `PackedFormat::amx_pairs` lays them out: the whole tiles of rows by
/// `tiles` (given those rows and `(out, xs.len())`), the rows after them
/// (fewer than a tile) through the AVX-512 kernel of `F`; `false`
/// (nothing written) when there is no whole tile or `tiles` declines
/// them.
///
/// # Safety
/// The CPU has the AVX-512 level's features (as `PackedFormat::vnni`).
pub(crate) unsafe fn tiles_then_rest<F: PackedFormat, const SHIFT: u32>(
    (groups, group_bytes): (&[u8], usize),
    (xs, rows): (&[F::Input<'_>], &[Q16Row<'_, SHIFT>]),
    out: &mut [[f32; GROUP_ROWS]],
    tiles: impl FnOnce(&[Q16Row<'_, SHIFT>], (&mut [[f32; GROUP_ROWS]], usize)) -> bool,
) -> bool {
    let (n, tiled) = (xs.len(), xs.len() / TILE_ROWS * TILE_ROWS);
    if tiled == 0 || !tiles(&rows[..tiled], (&mut *out, n)) {
        return false;
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

/// Asks for the bytes that a tile kernel reads after piece `s` of pair
/// `p` ([`next_piece`]) in the L2 cache: the kernels that fold or set a
/// pair's B operands once for all of a call's row tiles go piece by piece
/// (a span of blocks, a K-quant super-block: `piece_bytes` of each group,
/// the last piece of a group maybe shorter) across the call's pairs of
/// `group_bytes` groups in `groups`. So each pair's weights come from
/// memory in pieces a pair apart, which the hardware prefetchers did not
/// foresee, and the loads of the weights being set held up the setting.
/// On a Sapphire Rapids class Xeon the 1.1B Q4_K_M's prefill of 512
/// tokens rose 4.6 % (1.014-1.107, five alternated rounds).
#[inline(always)]
pub(crate) fn next_piece_into_l2(
    groups: &[u8],
    group_bytes: usize,
    (p, s): (usize, usize),
    piece_bytes: usize,
) {
    let pair_bytes = 2 * group_bytes;
    let shape = (
        groups.len() / pair_bytes.max(1),
        group_bytes.div_ceil(piece_bytes.max(1)),
    );
    let Some((p, s)) = next_piece((p, s), shape) else {
        return;
    };
    let pair = &groups[p * pair_bytes..][..pair_bytes];
    for group in pair.chunks_exact(group_bytes) {
        let piece = &group[s * piece_bytes..];
        super::prefetch::into_l2(&piece[..piece_bytes.min(piece.len())]);
    }
}

/// The pair and piece read after piece `s` of pair `p`, of `pairs` pairs
/// of `pieces` pieces: the next pair's piece `s`, after the last pair the
/// first pair's next piece, after the last of those none.
fn next_piece((p, s): (usize, usize), (pairs, pieces): (usize, usize)) -> Option<(usize, usize)> {
    let (p, s) = if p + 1 < pairs {
        (p + 1, s)
    } else {
        (0, s + 1)
    };
    (s < pieces).then_some((p, s))
}

#[cfg(test)]
mod tests {
    use super::next_piece;

    #[test]
    fn the_piece_after_each_goes_across_pairs_then_to_the_next_piece() {
        let shape = (3, 2);
        let order: Vec<_> =
            std::iter::successors(Some((0, 0)), |&at| next_piece(at, shape)).collect();
        assert_eq!(order, [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
        assert_eq!(next_piece((0, 0), (1, 1)), None);
    }
}
