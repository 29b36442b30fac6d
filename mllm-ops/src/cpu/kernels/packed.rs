//! Q4_0 and Q4_1 weights repacked at load for the 16-bit-activation integer
//! kernels, and the linear layer over them.
//!
//! A packed matrix stores its rows in groups of eight, block by block: for
//! each group and each block of 32 columns, 160 bytes hold the eight rows'
//! f16 scales `d`, their f16 offsets `m` (Q4_0's `-8·d`), then four 32-byte
//! chunks where chunk `j` holds the `j`-th 4-byte word of each row's nibbles:
//! bytes `4r..4r + 4` of chunk `j` are bytes `4j..4j + 4` of row `r`'s
//! block, whose low nibbles are the values at columns `4j..4j + 4` and high
//! nibbles those at `16 + 4j..16 + 4j + 4`. One 256-bit load therefore
//! holds four consecutive weights of all eight rows, and one broadcast
//! 4-byte activation word multiplies all of them at once: the block's sums
//! for the eight rows end up in the eight lanes of one register, with no
//! horizontal sums and one F16C conversion per eight scales.

use std::ops::Range;

use half::f16;
use mllm_core::file::TensorData;
use mllm_core::op::Activation;
use mllm_core::{DType, Error, Result};
use rayon::prelude::*;
use rayon::ThreadPool;

use super::activation::glu;
use super::qact::{ActivationScratch, BlockScales, Q16Act, Q16Row, BLOCK, BYTE, WIDE};
use super::qkernel::{QuantKernel, QuantPath, SimdLevel};
use super::qmatmul::{add_bias_rows, QuantMatrix, Split};
use super::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q4_0, q4_1, QuantType};

/// Rows per packed group.
pub(crate) const GROUP_ROWS: usize = 8;

/// Bytes of one packed block: eight f16 scales, eight f16 offsets and
/// 8 × 16 bytes of nibbles.
pub(crate) const PACKED_BLOCK_BYTES: usize = NIBBLES_AT + GROUP_ROWS * BLOCK / 2;

/// Offset of the nibbles in a packed Q4 (and Q5) block, after the eight
/// rows' f16 scales and offsets.
pub(crate) const NIBBLES_AT: usize = 4 * GROUP_ROWS;

/// Activation rows multiplied with one pass over a weight group.
pub(crate) const TILE_TOKENS: usize = 4;

/// Activation rows of the widest tile: the AVX-512 two-group products of
/// formats whose registers hold that many rows' sums (see
/// [`PackedFormat::PAIR_TILE_TOKENS`]).
pub(crate) const WIDE_TILE_TOKENS: usize = 8;

/// Where a tile of activation rows finds its weights, which decides
/// whether the kernels prefetch them into L2 as they go (see
/// `simd::prefetch::Streams`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightReads {
    /// The first tile over its groups reads them from memory: every tile
    /// of a decode step (one tile of one to [`TILE_TOKENS`] rows), the
    /// first of a batched or prefill step's tiles over each span.
    FromMemory,
    /// The later tiles over a span find its groups in the cache.
    FromCache,
}

impl WeightReads {
    /// Where the `pass`-th of several passes over the same weights (tiles
    /// of rows one after another, the first reading as `self`) finds them:
    /// every pass after the first, in the cache.
    pub(crate) fn of_pass(self, pass: usize) -> WeightReads {
        if pass == 0 {
            self
        } else {
            WeightReads::FromCache
        }
    }
}

/// Activation rows per block of a many-row call (bounds its scratch).
const ROW_BLOCK: usize = 128;

/// Weight bytes of the groups that every tile of rows goes through before
/// the next span of groups starts: small enough to stay in the L2 cache of
/// every x86-64 core we run on (512 KiB on Zen 3) next to the activations.
const SPAN_WEIGHT_BYTES: usize = 192 * 1024;

/// Group pairs per call of an AMX kernel ([`PackedFormat::amx_span_bytes`]):
/// it reads each span of activation blocks once for all of them. With two
/// pairs per call, one thread's Q4_K products of a 1B model's down
/// projection (16-bit rows, 8192 wide) took 1.35 times as long as with
/// sixteen; the Q8_0 kernel with one pair per call of that projection
/// gained nothing from its many tiles of rows.
#[cfg(target_arch = "x86_64")]
const AMX_SPAN_PAIRS: usize = 16;

/// Where a packed matrix's bytes live.
enum PackedBytes {
    /// Made at load.
    Owned(WeightMemory),
    /// The mapped tensor of a packed file.
    Mapped(TensorData),
}

/// The bytes of a packed `[rows, cols]` matrix, `block_bytes` per block of
/// eight rows by 32 columns, group after group: repacked at load, or read
/// in place from a file that stores the packed layout (`DType::Q4Packed`,
/// `Q8Packed`). Shared by [`PackedQ4`] and `PackedQ8`.
pub(crate) struct PackedData {
    bytes: PackedBytes,
    rows: usize,
    cols: usize,
    block_bytes: usize,
    outputs: RowOutputs,
}

/// What the products of a packed matrix give for each activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowOutputs {
    /// One output per weight row.
    Each,
    /// `act(gate) · up` per pair of groups, for a gated MLP's gate and up
    /// weights packed as one matrix group by group in turn (a gate group,
    /// the up group of the same rows, and so on): one output per pair of
    /// weight rows, in the gate rows' order. The products stay in the
    /// cache from the kernel to the gated activation, and the layer's
    /// output is half as wide.
    Gated(Activation),
}

impl RowOutputs {
    /// Weight rows per output.
    pub(crate) fn rows_per_output(self) -> usize {
        match self {
            RowOutputs::Each => 1,
            RowOutputs::Gated(_) => 2,
        }
    }
}

impl PackedData {
    /// Bytes made at load for a `[rows, cols]` matrix.
    pub(crate) fn owned(bytes: WeightMemory, rows: usize, cols: usize, block_bytes: usize) -> Self {
        PackedData {
            bytes: PackedBytes::Owned(bytes),
            rows,
            cols,
            block_bytes,
            outputs: RowOutputs::Each,
        }
    }

    /// Binds a mapped tensor of the packed `dtype` as `[rows, cols]` with
    /// `block_bytes` per block; errors name the tensor.
    pub(crate) fn mapped(
        data: TensorData,
        dtype: DType,
        [rows, cols]: [usize; 2],
        block_bytes: usize,
    ) -> Result<PackedData> {
        let name = data.name().to_string();
        if data.dtype() != dtype {
            return Err(Error::UnsupportedDType(format!(
                "weight '{name}' has dtype {}, not {dtype}",
                data.dtype()
            )));
        }
        if !rows.is_multiple_of(GROUP_ROWS) || !cols.is_multiple_of(BLOCK) {
            return Err(Error::InvalidInput(format!(
                "weight '{name}' of dtype {dtype} has shape [{rows}, {cols}]: packed weights need \
                 rows in groups of {GROUP_ROWS} and columns in blocks of {BLOCK}"
            )));
        }
        let want = rows / GROUP_ROWS * (cols / BLOCK) * block_bytes;
        if data.bytes().len() != want {
            return Err(Error::InvalidInput(format!(
                "weight '{name}' of dtype {dtype} holds {} bytes; [{rows}, {cols}] needs {want}",
                data.bytes().len()
            )));
        }
        Ok(PackedData {
            bytes: PackedBytes::Mapped(data),
            rows,
            cols,
            block_bytes,
            outputs: RowOutputs::Each,
        })
    }

    /// All the packed bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.bytes {
            PackedBytes::Owned(v) => v,
            PackedBytes::Mapped(d) => d.bytes(),
        }
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// What the products give per activation row.
    pub(crate) fn outputs(&self) -> RowOutputs {
        self.outputs
    }

    /// Makes the products give `act(gate) · up` (see [`RowOutputs::Gated`]):
    /// for a matrix packed from a gate and an up weight group by group in
    /// turn. Fails unless the rows are whole pairs of groups.
    pub(crate) fn gate(&mut self, act: Activation) -> Result<()> {
        if !self.rows.is_multiple_of(2 * GROUP_ROWS) {
            return Err(Error::InvalidInput(format!(
                "{} rows are not whole pairs of {GROUP_ROWS}-row groups, gate and up",
                self.rows
            )));
        }
        self.outputs = RowOutputs::Gated(act);
        Ok(())
    }

    /// The packed blocks of the `n` row groups from group `g` on.
    pub(crate) fn groups(&self, g: usize, n: usize) -> &[u8] {
        let len = self.cols / BLOCK * self.block_bytes;
        &self.bytes()[g * len..(g + n) * len]
    }
}

/// A packed weight layout (rows in groups of [`GROUP_ROWS`], a group's
/// bytes block after block of 32 columns) and its group products at each
/// instruction set; `QuantKernel::packed_dot` picks one for the CPU. The
/// SIMD products take their tile's [`WeightReads`], which decides whether
/// they prefetch the weights.
pub(crate) trait PackedFormat {
    /// One activation row as the kernels take it.
    type Input<'a>: Copy + Sync;
    /// Bytes of one group per block of 32 columns.
    const BLOCK_BYTES: usize;
    /// Activation rows per call of the one-group products (`avx2`,
    /// `vnni`); the portable one takes any number.
    const GROUP_TILE_TOKENS: usize = TILE_TOKENS;
    /// Activation rows per call of the AVX-512 two-group product
    /// ([`PackedFormat::vnni_pair`], at most [`WIDE_TILE_TOKENS`]): the
    /// tile of rows over a matrix at that level. Each call sums over all
    /// the columns once per block for each row, so a wider tile spreads
    /// the weights' loads and a call's fixed costs over more rows.
    const PAIR_TILE_TOKENS: usize = TILE_TOKENS;
    /// Values per scale of the activation rows the format takes (see
    /// `qact::quantize_q16_into`): a block of 32, or a K-quant's
    /// super-block.
    const PER_SCALE: usize = BLOCK;
    /// Blocks of 32 values in `x`.
    fn blocks(x: &Self::Input<'_>) -> usize;
    /// The eight outputs of one group for each of one to
    /// [`PackedFormat::GROUP_TILE_TOKENS`] activation rows, in portable
    /// code.
    fn portable(group: &[u8], xs: &[Self::Input<'_>], out: &mut [[f32; GROUP_ROWS]]);
    /// [`PackedFormat::portable`] with AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(
        group: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// Two consecutive groups `a` and `b` with AVX2: `out[t]` for `a`,
    /// `out[xs.len() + t]` for `b`, for one to [`TILE_TOKENS`] rows (the
    /// float layout: `HALF_TILE_TOKENS`); by default each group alone
    /// through [`PackedFormat::avx2`].
    ///
    /// # Safety
    /// As [`PackedFormat::avx2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        each_of_pair(
            [a, b],
            xs,
            Self::GROUP_TILE_TOKENS,
            out,
            reads,
            |group, xs, out, reads| {
                // SAFETY: the caller guarantees the features (this method's
                // contract is `avx2`'s).
                unsafe { Self::avx2(group, xs, out, reads) }
            },
        );
    }
    /// The outputs of the consecutive groups in `groups` for the one
    /// activation row `x` with AVX2 (`out[g]` for group `g`), with the bits
    /// of [`PackedFormat::avx2`], in one call that sets the row up once
    /// (decode's products, a span of groups at a time); `false` (and
    /// nothing written) where the format has no such kernel.
    ///
    /// # Safety
    /// As [`PackedFormat::avx2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_row_run(
        _groups: &[u8],
        _x: Self::Input<'_>,
        _out: &mut [[f32; GROUP_ROWS]],
        _reads: WeightReads,
    ) -> bool {
        false
    }
    /// [`PackedFormat::portable`] with AVX-VNNI (the 256-bit `vpdpbusd`
    /// without AVX-512); by default [`PackedFormat::avx2`], for layouts
    /// whose products take no bytes.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C and AVX-VNNI.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx_vnni(
        group: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C among others.
        unsafe { Self::avx2(group, xs, out, reads) }
    }
    /// Two consecutive groups `a` and `b` with AVX-VNNI, as
    /// [`PackedFormat::avx2_pair`]; by default each group alone through
    /// [`PackedFormat::avx_vnni`].
    ///
    /// # Safety
    /// As [`PackedFormat::avx_vnni`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx_vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        each_of_pair(
            [a, b],
            xs,
            Self::GROUP_TILE_TOKENS,
            out,
            reads,
            |group, xs, out, reads| {
                // SAFETY: the caller guarantees the features (this method's
                // contract is `avx_vnni`'s).
                unsafe { Self::avx_vnni(group, xs, out, reads) }
            },
        );
    }
    /// [`PackedFormat::portable`] with AVX-512 VNNI on 256-bit vectors.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C, AVX-512F/VL/BW and AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni(
        group: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// Two consecutive groups `a` and `b` at once on 512-bit vectors:
    /// `out[t]` for `a`, `out[xs.len() + t]` for `b`.
    ///
    /// # Safety
    /// As [`PackedFormat::vnni`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Self::Input<'_>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// Whether the format has [`PackedFormat::amx_pairs`], the tile
    /// product of the AMX level: then that level takes its activation rows
    /// [`PackedFormat::amx_rows`] at a time.
    const AMX: bool = false;
    /// Activation rows per call of [`PackedFormat::amx_pairs`] for rows of
    /// `cols` values: one tile of 16.
    #[cfg(target_arch = "x86_64")]
    fn amx_rows(_cols: usize) -> usize {
        super::simd::amx::TILE_ROWS
    }
    /// Bytes of weights per call of [`PackedFormat::amx_pairs`] for rows
    /// of `cols` values: those of [`AMX_SPAN_PAIRS`] group pairs, whose
    /// span of activation blocks serves all of them while it is in cache.
    #[cfg(target_arch = "x86_64")]
    fn amx_span_bytes(cols: usize) -> usize {
        AMX_SPAN_PAIRS * 2 * cols / BLOCK * Self::BLOCK_BYTES
    }
    /// [`PackedFormat::vnni_pair`] of the activation rows `xs` (as many as
    /// [`PackedFormat::amx_rows`] says) on AMX tiles (`simd::amx`), with
    /// the same results, for each pair of consecutive groups in `groups`
    /// (an even number of groups of `group_bytes` each: `out[g·n + t]` for
    /// group `g` and row `t` of `n`); `false` (and nothing written) where
    /// the format has none or the rows are not ones that tiles read in
    /// place (`simd::amx::TileRows`).
    ///
    /// # Safety
    /// As [`PackedFormat::vnni`], and the CPU has AMX tiles that this
    /// process may use (`simd::amx::tiles_available`).
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs(
        _groups: &[u8],
        _group_bytes: usize,
        _xs: &[Self::Input<'_>],
        _out: &mut [[f32; GROUP_ROWS]],
    ) -> bool {
        false
    }
}

/// Implements the instruction-set group products of a packed format (the
/// `avx2`, `avx_vnni`, `vnni` and `vnni_pair` methods of [`PackedFormat`],
/// or the same of `packed_q4k::SubBlockBits`, generic over `$generics`)
/// for activation rows of type `$input` by forwarding to `group_dot` of
/// the simd modules `$avx2` and `$avx_vnni` and `group_dot` / `pair_dot` of
/// `$vnni`.
macro_rules! simd_group_products {
    ([$($generics:tt)*], $input:ty, $avx2:ident, $($avx_vnni:ident)::+, $vnni:ident) => {
        /// # Safety
        /// The trait method's: the CPU has the features it names.
        #[cfg(target_arch = "x86_64")]
        unsafe fn avx2<$($generics)*>(
            group: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            // SAFETY: the caller guarantees the features (trait contract).
            unsafe { $crate::cpu::kernels::simd::$avx2::group_dot(group, xs, out, reads) }
        }

        /// # Safety
        /// The trait method's: the CPU has the features it names.
        #[cfg(target_arch = "x86_64")]
        unsafe fn avx_vnni<$($generics)*>(
            group: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            // SAFETY: the caller guarantees the features (trait contract).
            unsafe { $crate::cpu::kernels::simd::$($avx_vnni)::+::group_dot(group, xs, out, reads) }
        }

        /// # Safety
        /// The trait method's: the CPU has the features it names.
        #[cfg(target_arch = "x86_64")]
        unsafe fn vnni<$($generics)*>(
            group: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            // SAFETY: the caller guarantees the features (trait contract).
            unsafe { $crate::cpu::kernels::simd::$vnni::group_dot(group, xs, out, reads) }
        }

        /// # Safety
        /// The trait method's: the CPU has the features it names.
        #[cfg(target_arch = "x86_64")]
        unsafe fn vnni_pair<$($generics)*>(
            a: &[u8],
            b: &[u8],
            xs: &[$input],
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) {
            // SAFETY: the caller guarantees the features (trait contract).
            unsafe { $crate::cpu::kernels::simd::$vnni::pair_dot(a, b, xs, out, reads) }
        }
    };
}

pub(crate) use simd_group_products;

/// Implements [`PackedFormat::avx2_row_run`] for a format whose AVX2 row
/// run is `$run` (as `simd::avx2_packed_row::q4_row_run`).
macro_rules! avx2_row_runs {
    ($run:path) => {
        /// # Safety
        /// The trait method's: the CPU has AVX2, FMA and F16C.
        #[cfg(target_arch = "x86_64")]
        unsafe fn avx2_row_run(
            groups: &[u8],
            x: Self::Input<'_>,
            out: &mut [[f32; GROUP_ROWS]],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> bool {
            // SAFETY: the caller guarantees AVX2, FMA and F16C (trait
            // contract).
            unsafe { $run(groups, x, out, reads) };
            true
        }
    };
}

pub(crate) use avx2_row_runs;

/// Implements [`PackedFormat::AMX`], [`PackedFormat::amx_rows`] and
/// [`PackedFormat::amx_pairs`] for 16-bit activation rows split at `SHIFT`
/// (`Q16Row`) whose AMX kernel over many tiles of rows is `$pairs` (as
/// `simd::amx_packed::q4::pairs`): as many tiles per call as the K-quant
/// kernels take (`packed_q4k::amx_rows_for`), each pair's B operands set
/// once for all of them.
macro_rules! amx_pairs_of_rows {
    ($pairs:path) => {
        const AMX: bool = true;

        #[cfg(target_arch = "x86_64")]
        fn amx_rows(cols: usize) -> usize {
            $crate::cpu::kernels::packed_q4k::amx_rows_for::<SHIFT>(cols)
        }

        /// # Safety
        /// The trait method's: the CPU has the features it names.
        #[cfg(target_arch = "x86_64")]
        unsafe fn amx_pairs(
            groups: &[u8],
            group_bytes: usize,
            xs: &[Q16Row<'_, SHIFT>],
            out: &mut [[f32; GROUP_ROWS]],
        ) -> bool {
            use $crate::cpu::kernels::simd::amx::row_tiles_then_rest;
            use $pairs as tile_pairs;
            let groups = (groups, group_bytes);
            // SAFETY: the caller guarantees the AVX-512 level's features and
            // AMX with the permission to use it (trait contract).
            unsafe {
                row_tiles_then_rest::<Self, SHIFT>(groups, (xs, xs), out, tile_pairs::<SHIFT>)
            }
        }
    };
}

pub(crate) use amx_pairs_of_rows;

/// The packed Q4_0 / Q4_1 layout (see the module documentation) for
/// activation rows split at `SHIFT` ([`WIDE`] or `BYTE`).
pub(crate) struct Q4Format<const SHIFT: u32>;

impl<const SHIFT: u32> PackedFormat for Q4Format<SHIFT> {
    type Input<'a> = Q16Row<'a, SHIFT>;
    const BLOCK_BYTES: usize = PACKED_BLOCK_BYTES;

    fn blocks(x: &Q16Row<'_, SHIFT>) -> usize {
        x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q16Row<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    /// # Safety
    /// The trait method's: the CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (trait contract).
        unsafe { super::simd::avx2_packed_pair::pair_dot(a, b, xs, out, reads) }
    }

    avx2_row_runs!(super::simd::avx2_packed_row::q4_row_run);

    simd_group_products!(
        [],
        Q16Row<'_, SHIFT>,
        avx2_packed,
        avx_vnni_packed::q4,
        vnni_packed
    );

    amx_pairs_of_rows!(super::simd::amx_packed::q4::pairs);
}

/// A Q4_0 or Q4_1 matrix `[rows, cols]` repacked in groups of eight rows
/// (see the module documentation).
pub struct PackedQ4 {
    data: PackedData,
}

impl PackedQ4 {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not Q4_0 or Q4_1, when its row count
    /// is not a multiple of eight, or when a Q4_0 offset `-8·d` overflows
    /// f16.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ4> {
        Self::pack_with(std::slice::from_ref(w), None, &|_| {})
    }

    /// [`Self::pack`] of `parts`, matrices of one type and width stacked
    /// into one (see `packed::SourceRows`), into a buffer from `arena` (a
    /// buffer of its own without one), calling `copied` with each range of
    /// stacked rows once it is packed (see `packed::pack_blocks`).
    pub fn pack_with(
        parts: &[QuantMatrix<'_>],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<PackedQ4> {
        let w = SourceRows::new(parts, &[QuantType::Q4_0, QuantType::Q4_1], "q4")?;
        let (rows, cols, qt) = (w.rows(), w.cols(), w.quant_type());
        let nb = cols / BLOCK;
        let mut data = WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * nb * PACKED_BLOCK_BYTES)?;
        pack_blocks(&mut data, PACKED_BLOCK_BYTES, nb, copied, |g, i, out| {
            for r in 0..GROUP_ROWS {
                let (d, m, qs) = block_parts(qt, w.row(g * GROUP_ROWS + r), i)?;
                out[2 * r..2 * r + 2].copy_from_slice(&d);
                out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&m);
                for j in 0..4 {
                    let at = NIBBLES_AT + 32 * j + 4 * r;
                    out[at..at + 4].copy_from_slice(&qs[4 * j..4 * j + 4]);
                }
            }
            Ok(())
        })?;
        Ok(PackedQ4 {
            data: PackedData::owned(data, rows, cols, PACKED_BLOCK_BYTES),
        })
    }

    /// A `DType::Q4Packed` tensor of `[rows, cols]`, read in place.
    pub fn mapped(data: TensorData, shape: [usize; 2]) -> Result<PackedQ4> {
        let data = PackedData::mapped(data, DType::Q4Packed, shape, PACKED_BLOCK_BYTES)?;
        Ok(PackedQ4 { data })
    }

    /// The packed bytes (what a packed file stores).
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Row `r`'s values from the packed bytes of its group (`d·q + m`,
    /// the values Q4_0 and Q4_1 dequantize to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (blk, out) in group
            .chunks_exact(PACKED_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
            let (d, m) = (f(2 * r), f(16 + 2 * r));
            unpack_nibble_block(&blk[NIBBLES_AT..], r, (d, m), out);
        }
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.data.rows()
    }

    /// Values per row (input features).
    pub fn cols(&self) -> usize {
        self.data.cols()
    }

    /// The packed blocks of the `n` row groups from group `g` on.
    pub(crate) fn groups(&self, g: usize, n: usize) -> &[u8] {
        self.data.groups(g, n)
    }
}

/// The rows of one or more quantized matrices of one block type and
/// width, one after another: what a packer reads (several for stacked
/// linear layers, packed as one matrix).
#[derive(Clone, Copy)]
pub(crate) struct SourceRows<'p, 'a> {
    parts: &'p [QuantMatrix<'a>],
    /// The rows of each part when all have as many (a direct lookup).
    uniform_rows: Option<usize>,
}

impl<'p, 'a> SourceRows<'p, 'a> {
    /// `parts` as the source of the packed layout `layout` made for the
    /// block types `types`: at least one, each of one of those types (all
    /// the same, of one width) and with rows that fill whole groups of
    /// [`GROUP_ROWS`].
    pub(crate) fn new(
        parts: &'p [QuantMatrix<'a>],
        types: &[QuantType],
        layout: &str,
    ) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidInput(format!(
                "no matrix to pack as {layout}"
            )));
        };
        for w in parts {
            let qt = w.quant_type();
            if !types.contains(&qt) {
                let names: Vec<String> = types.iter().map(|t| t.to_string()).collect();
                return Err(Error::UnsupportedDType(format!(
                    "only {} weights can be packed as {layout}, not {qt}",
                    names.join(" and ")
                )));
            }
            if qt != first.quant_type() || w.cols() != first.cols() {
                return Err(Error::InvalidInput(format!(
                    "matrices packed as one must share a type and a width: {} x {} and {qt} x {}",
                    first.quant_type(),
                    first.cols(),
                    w.cols()
                )));
            }
            if !w.rows().is_multiple_of(GROUP_ROWS) {
                return Err(Error::InvalidInput(format!(
                    "{} rows are not a whole number of {GROUP_ROWS}-row groups",
                    w.rows()
                )));
            }
        }
        let uniform_rows = Some(first.rows()).filter(|&n| parts.iter().all(|w| w.rows() == n));
        Ok(SourceRows {
            parts,
            uniform_rows,
        })
    }

    /// The block type.
    pub(crate) fn quant_type(&self) -> QuantType {
        self.parts[0].quant_type()
    }

    /// Values per row.
    pub(crate) fn cols(&self) -> usize {
        self.parts[0].cols()
    }

    /// Rows of every part.
    pub(crate) fn rows(&self) -> usize {
        self.parts.iter().map(|w| w.rows()).sum()
    }

    /// The blocks of row `r` of the stack.
    pub(crate) fn row(&self, r: usize) -> &'a [u8] {
        if let Some(n) = self.uniform_rows.filter(|&n| n > 0) {
            return self.parts[r / n].row(r % n);
        }
        let (part, r) = stacked_row(self.parts.iter().map(|w| w.rows()), r);
        self.parts[part].row(r)
    }
}

/// Which part holds row `r` of parts of `part_rows` rows stacked one after
/// another, and the row's index within it.
pub(crate) fn stacked_row(part_rows: impl IntoIterator<Item = usize>, r: usize) -> (usize, usize) {
    match stacked_ranges(part_rows, r..r + 1).next() {
        Some((part, rows)) => (part, rows.start),
        None => panic!("row {r} past the stacked rows"),
    }
}

/// The stacked rows `r` of parts of `part_rows` rows stacked one after
/// another, part by part: each part they reach and the rows within it.
pub(crate) fn stacked_ranges(
    part_rows: impl IntoIterator<Item = usize>,
    r: Range<usize>,
) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut first = 0;
    part_rows
        .into_iter()
        .enumerate()
        .filter_map(move |(part, rows)| {
            let (lo, hi) = (r.start.max(first), r.end.min(first + rows));
            first += rows;
            (lo < hi).then(|| (part, lo + rows - first..hi + rows - first))
        })
}

/// The f16 scale, the f16 offset and the 16 nibble bytes of block `i` of a
/// Q4_0 or Q4_1 row.
fn block_parts(qt: QuantType, row: &[u8], i: usize) -> Result<([u8; 2], [u8; 2], [u8; 16])> {
    let bytes = qt.block_bytes();
    let b = &row[i * bytes..(i + 1) * bytes];
    let d = [b[0], b[1]];
    if qt == QuantType::Q4_1 {
        let qs = b[4..q4_1::BLOCK_BYTES].try_into().expect("16 bytes");
        return Ok((d, [b[2], b[3]], qs));
    }
    let m = f16::from_f32(-8.0 * f16::from_le_bytes(d).to_f32());
    if !m.is_finite() {
        return Err(Error::InvalidInput(format!(
            "q4_0 scale {} is too large to pack",
            f16::from_le_bytes(d)
        )));
    }
    let qs = b[2..q4_0::BLOCK_BYTES].try_into().expect("16 bytes");
    Ok((d, m.to_le_bytes(), qs))
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to [`TILE_TOKENS`] rows), in portable code: per block and row
/// `d·d_x·Σ q_w q_x + m·s_x`, accumulated in f32.
pub(crate) fn group_dot<const SHIFT: u32>(
    group: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        *out = [0.0; GROUP_ROWS];
        let blocks = group.chunks_exact(PACKED_BLOCK_BYTES);
        let xb = x.hi.chunks_exact(BLOCK).zip(x.lo.chunks_exact(BLOCK));
        for ((blk, (hi, lo)), (&dx, &sx)) in blocks.zip(xb).zip(x.d.iter().zip(x.s)) {
            for (r, acc) in out.iter_mut().enumerate() {
                let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
                let (d, m) = (f(2 * r), f(16 + 2 * r));
                let sum = nibble_block_sum::<SHIFT>(&blk[NIBBLES_AT..], r, hi, lo);
                *acc += d * dx * sum as f32 + m * sx;
            }
        }
    }
}

/// Row `r`'s 32 values `d·q + m` of one block, from the block's 128 bytes
/// of nibbles in the packed chunk layout.
pub(crate) fn unpack_nibble_block(nibbles: &[u8], r: usize, (d, m): (f32, f32), out: &mut [f32]) {
    for j in 0..4 {
        for c in 0..4 {
            let byte = nibbles[32 * j + 4 * r + c];
            out[4 * j + c] = d * (byte & 15) as f32 + m;
            out[16 + 4 * j + c] = d * (byte >> 4) as f32 + m;
        }
    }
}

/// Row `r`'s exact sum `Σ q_w · q_x` over one block of 32 columns, from
/// the block's 128 bytes of nibbles in the packed chunk layout and the
/// block's two activation planes split at `SHIFT` (`q_x = 2^SHIFT·hi +
/// lo`).
pub(crate) fn nibble_block_sum<const SHIFT: u32>(
    nibbles: &[u8],
    r: usize,
    hi: &[i8],
    lo: &[i8],
) -> i32 {
    let mut sum = 0i32;
    for j in 0..4 {
        for c in 0..4 {
            let byte = nibbles[32 * j + 4 * r + c];
            let (k_lo, k_hi) = (4 * j + c, 16 + 4 * j + c);
            let q = |k: usize| ((hi[k] as i32) << SHIFT) + lo[k] as i32;
            sum += (byte & 15) as i32 * q(k_lo) + (byte >> 4) as i32 * q(k_hi);
        }
    }
    sum
}

/// Linear layer over a packed matrix: `y[t, o] = Σ_i x[t, i] · W[o, i] +
/// bias[o]` with the activation rows quantized to 16 bits (two 8-bit
/// planes per block of 32 split at `WIDE`, see `Q16Act`). `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`. Parallel over row groups in
/// `pool` unless the work is tiny; `TILE_TOKENS` activation rows share
/// each pass over a group, blocks of `ROW_BLOCK` rows one scratch; the
/// quantized rows go into the buffers of `scratch`.
/// Slice lengths are checked with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ4,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    let w = &w.data;
    if k.path() == QuantPath::Int8Packed {
        wide_packed_linear::<Q4Format<BYTE>, BYTE>(k, x, rows, w, bias, y, pool, scratch)
    } else {
        wide_packed_linear::<Q4Format<WIDE>, WIDE>(k, x, rows, w, bias, y, pool, scratch)
    }
}

/// [`packed_linear`] over the packed matrix `w` of any format `F` whose
/// kernels take the activation rows split at `SHIFT` as they are (Q4 and
/// Q5 at [`WIDE`], Q4_K and Q5_K at [`WIDE`] or `BYTE`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn wide_packed_linear<F, const SHIFT: u32>(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedData,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) where
    F: for<'a> PackedFormat<Input<'a> = Q16Row<'a, SHIFT>>,
{
    let in_f = w.cols();
    by_row_blocks(w, x, rows, bias, y, pool, |xb, split, yt| {
        quantize_rows::<SHIFT>(k, (xb, in_f, F::PER_SCALE), split, scratch, |xs| {
            packed_group_outputs::<F>(k, w, xs, split, yt);
        });
    });
}

/// The frame of a packed linear layer over the `[w_rows, in_f]` matrix
/// `w`, `out_f` outputs per row (`w_rows`, or half of them for gated
/// outputs, see [`RowOutputs`]): `product(x rows, split, out)` writes the
/// outputs of the given activation rows into `out` (`[rows, out_f]`);
/// this runs it over blocks of at most [`ROW_BLOCK`] rows of `y` and adds
/// the bias (`out_f` values; none for gated outputs).
pub(crate) fn by_row_blocks(
    w: &PackedData,
    x: &[f32],
    rows: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    product: impl Fn(&[f32], &Split<'_>, &mut [f32]) + Sync,
) {
    let (in_f, w_rows, outputs) = (w.cols(), w.rows(), w.outputs());
    let out_f = w_rows / outputs.rows_per_output();
    debug_assert_eq!(x.len(), rows * in_f, "x must be [rows, in_f]");
    debug_assert_eq!(y.len(), rows * out_f, "y must be [rows, out_f]");
    debug_assert!(
        bias.is_none() || outputs == RowOutputs::Each,
        "no bias with gated outputs"
    );
    if rows == 0 || out_f == 0 {
        return;
    }
    let split = Split::new(pool, rows * in_f * w_rows);
    let mut run = || {
        for (xb, yb) in x
            .chunks(ROW_BLOCK * in_f)
            .zip(y.chunks_mut(ROW_BLOCK * out_f))
        {
            product(xb, &split, yb);
        }
    };
    // One hand-over to the pool for the whole call: the quantization and
    // the products of every row block then split from a worker.
    match split.pool() {
        Some(pool) => pool.install(run),
        None => run(),
    }
    add_bias_rows(y, out_f, bias);
}

/// Values below which quantizing activations is not worth a fork-join
/// (a step of a few dozen tokens quantizes in microseconds).
const PAR_QUANTIZE_VALUES: usize = 1 << 15;

/// The pool and the rows per task of a pass over `rows` activation rows
/// of `in_f` values each, split by rows: `None` (one thread) unless the
/// call is parallel and has many values.
fn row_tasks<'p>(split: &Split<'p>, rows: usize, in_f: usize) -> Option<(&'p ThreadPool, usize)> {
    let pool = split
        .pool()
        .filter(|_| rows * in_f >= PAR_QUANTIZE_VALUES.max(2 * in_f))?;
    Some((pool, rows.div_ceil(4 * pool.current_num_threads()).max(1)))
}

/// Quantizes the rows of `x` (each `in_f` long) to 16 bits with the plane
/// split `SHIFT`, one scale per `per_scale` values (see
/// `qact::quantize_q16_into`), into the buffers of `scratch` (rows one
/// `qact::row_stride` apart), split over the pool by rows when the call
/// is parallel and has many values, calls `use_rows` with them and puts
/// the buffers back.
pub(crate) fn quantize_rows<const SHIFT: u32>(
    k: QuantKernel,
    (x, in_f, per_scale): (&[f32], usize, usize),
    split: &Split<'_>,
    scratch: &ActivationScratch,
    use_rows: impl FnOnce(&[Q16Row<'_, SHIFT>]),
) {
    let rows = x.len() / in_f;
    let mut act = Q16Act::rows_in_buffers(rows, in_f, scratch.take());
    let (stride, nb) = (act.stride(), in_f / BLOCK);
    let (hi, lo, scales) = act.parts_mut();
    let quantize = |hi: &mut [i8], lo: &mut [i8], scales: BlockScales<'_>, x: &[f32]| {
        let planes = hi.chunks_mut(stride).zip(lo.chunks_mut(stride));
        let per_row = scales
            .d
            .chunks_mut(nb)
            .zip(scales.s.chunks_mut(nb))
            .zip(scales.sums.chunks_mut(nb));
        for (((hi, lo), ((d, s), sums)), x) in planes.zip(per_row).zip(x.chunks(in_f)) {
            let row_scales = BlockScales { d, s, sums };
            k.quantize_act16_into::<SHIFT>(
                x,
                &mut hi[..in_f],
                &mut lo[..in_f],
                row_scales,
                per_scale,
            );
        }
    };
    match row_tasks(split, rows, in_f) {
        None => quantize(hi, lo, scales, x),
        Some((pool, per_task)) => {
            let (bytes, blocks) = (per_task * stride, per_task * nb);
            let BlockScales { d, s, sums } = scales;
            let parts = hi
                .par_chunks_mut(bytes)
                .zip(lo.par_chunks_mut(bytes))
                .zip(d.par_chunks_mut(blocks))
                .zip(s.par_chunks_mut(blocks))
                .zip(sums.par_chunks_mut(blocks))
                .zip(x.par_chunks(per_task * in_f));
            pool.install(|| {
                parts.for_each(|(((((hi, lo), d), s), sums), x)| {
                    quantize(hi, lo, BlockScales { d, s, sums }, x)
                })
            });
        }
    }
    use_rows(&act.rows());
    scratch.put(act.into_buffers());
}

/// Fills `out`, `per_row` items for each of the activation `rows` (of
/// `in_f` values each), by `fill(row, its items)`: split by rows over the
/// pool as [`quantize_rows`] is.
pub(crate) fn fill_by_rows<R: Sync, T: Send>(
    split: &Split<'_>,
    in_f: usize,
    rows: &[R],
    per_row: usize,
    out: &mut [T],
    fill: impl Fn(&R, &mut [T]) + Sync,
) {
    let fill_rows = |rows: &[R], out: &mut [T]| {
        for (row, items) in rows.iter().zip(out.chunks_mut(per_row)) {
            fill(row, items)
        }
    };
    let Some((pool, per_task)) = row_tasks(split, rows.len(), in_f) else {
        return fill_rows(rows, out);
    };
    pool.install(|| {
        out.par_chunks_mut(per_task * per_row)
            .zip(rows.par_chunks(per_task))
            .for_each(|(out, rows)| fill_rows(rows, out))
    });
}

/// Writes the outputs of every row group (`groups(g, n)`: the `n` groups
/// from `g` on, each of `cols` weights per row, whose products give the
/// outputs that come with them, see [`RowOutputs`]) for the activation
/// rows `xs` into `dst` (`[xs.len(), out_f]`, row-major), parallel over blocks
/// of groups, each task writing its columns of every row; `dot`
/// multiplies one or two consecutive groups with one to `tile` rows
/// (outputs of the second group after those of the first):
/// [`TILE_TOKENS`], or [`packed_half::HALF_TILE_TOKENS`] for the float
/// layout.
///
/// A task goes through its groups a span at a time ([`SPAN_WEIGHT_BYTES`]),
/// every tile of rows over the whole span, so that each output row is
/// written in runs of consecutive columns while the span's weights stay in
/// cache. `dot` is told which tile reads a span from memory (the first
/// over it) and which find it in cache ([`WeightReads`]).
///
/// [`packed_half::HALF_TILE_TOKENS`]: super::packed_half::HALF_TILE_TOKENS
pub(crate) fn group_outputs<'g, A: Sync>(
    groups: (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    tile: usize,
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    outputs_by_calls(groups, cols, xs, tile, None, split, dst, dot)
}

/// [`group_outputs`] with `dot` called once per span (of about
/// `span_bytes` of weights) and tile of rows, with all the span's groups
/// (outputs group after group): for kernels with a fixed cost per call
/// (the AMX level's tile configuration).
pub(crate) fn group_outputs_by_spans<'g, A: Sync>(
    groups: (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    (tile, span_bytes): (usize, usize),
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    outputs_by_calls(groups, cols, xs, tile, Some(span_bytes), split, dst, dot)
}

/// [`group_outputs`], calling `dot` with a span's groups two at a time,
/// or all at once with `whole_spans` (the bytes of weights per span).
/// Gated outputs go through a per-thread stage: each row's gate and up
/// products of a span, then `act(gate) · up` of them into the row at once.
#[allow(clippy::too_many_arguments)]
fn outputs_by_calls<'g, A: Sync>(
    (groups, outputs): (&(impl Fn(usize, usize) -> &'g [u8] + Sync), RowOutputs),
    cols: usize,
    xs: &[A],
    tile: usize,
    whole_spans: Option<usize>,
    split: &Split<'_>,
    dst: &mut [f32],
    dot: impl Fn(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads) + Sync + Send,
) {
    let Some(out_f) = dst.len().checked_div(xs.len()) else {
        return;
    };
    let rows_per_output = outputs.rows_per_output();
    let per_task = split
        .outputs_per_task(rows_per_output * out_f, cols, xs.len())
        .div_ceil(GROUP_ROWS)
        .next_multiple_of(2);
    split.for_column_blocks(
        dst,
        out_f,
        per_task * GROUP_ROWS / rows_per_output,
        || (vec![[0.0f32; GROUP_ROWS]; 2 * tile], Vec::new()),
        |(tile_out, stage), c, rows_out| {
            let task_groups = rows_per_output * rows_out[0].len() / GROUP_ROWS;
            let pair_bytes = 2 * groups(c * per_task, 1).len();
            let span_bytes = whole_spans.unwrap_or(SPAN_WEIGHT_BYTES);
            let span = 2 * (span_bytes / pair_bytes.max(1)).max(1);
            let per_call = if whole_spans.is_some() { span } else { 2 };
            for first in (0..task_groups).step_by(span) {
                let last = task_groups.min(first + span);
                let staged = (last - first) / 2 * GROUP_ROWS;
                if let RowOutputs::Gated(_) = outputs {
                    stage.resize(2 * staged * xs.len(), 0.0);
                }
                for (ti, rows) in xs.chunks(tile).enumerate() {
                    let rows_out = &mut rows_out[ti * tile..];
                    let reads = WeightReads::FromMemory.of_pass(ti);
                    for call in (first..last).step_by(per_call) {
                        let n = per_call.min(last - call);
                        if tile_out.len() < n * rows.len() {
                            tile_out.resize(n * rows.len(), [0.0; GROUP_ROWS]);
                        }
                        let out = &mut tile_out[..n * rows.len()];
                        dot(groups(c * per_task + call, n), rows, out, reads);
                        let group_out = |gi: usize, t: usize| &out[gi * rows.len() + t];
                        if let RowOutputs::Gated(_) = outputs {
                            // Row by row, gate products then up products.
                            let at = (call - first) / 2 * GROUP_ROWS;
                            let stage = &mut stage[2 * staged * ti * tile..];
                            for (t, row) in stage
                                .chunks_exact_mut(2 * staged)
                                .take(rows.len())
                                .enumerate()
                            {
                                let (gate, up) = row.split_at_mut(staged);
                                let pairs = gate[at..at + n / 2 * GROUP_ROWS]
                                    .chunks_exact_mut(GROUP_ROWS)
                                    .zip(up[at..].chunks_exact_mut(GROUP_ROWS));
                                for (p, (g, u)) in pairs.enumerate() {
                                    g.copy_from_slice(group_out(2 * p, t));
                                    u.copy_from_slice(group_out(2 * p + 1, t));
                                }
                            }
                            continue;
                        }
                        // Row by row, so that each row's outputs are written
                        // in one run (the rows lie far apart in `dst`).
                        let at = call * GROUP_ROWS;
                        for (t, row_out) in rows_out.iter_mut().take(rows.len()).enumerate() {
                            let row_out = &mut row_out[at..at + n * GROUP_ROWS];
                            for (gi, o) in row_out.chunks_exact_mut(GROUP_ROWS).enumerate() {
                                o.copy_from_slice(group_out(gi, t));
                            }
                        }
                    }
                }
                if let RowOutputs::Gated(act) = outputs {
                    let at = first / 2 * GROUP_ROWS;
                    for (row, row_out) in stage.chunks_exact(2 * staged).zip(rows_out.iter_mut()) {
                        let (gate, up) = row.split_at(staged);
                        glu(act, gate, up, &mut row_out[at..at + staged]);
                    }
                }
            }
        },
    );
}

/// [`group_outputs`] over the groups of `w`, of the packed format `F`, [`TILE_TOKENS`]
/// rows per tile ([`PackedFormat::PAIR_TILE_TOKENS`] at the AVX-512
/// level), each through `k`'s group products.
pub(crate) fn packed_group_outputs<F: PackedFormat>(
    k: QuantKernel,
    w: &PackedData,
    xs: &[F::Input<'_>],
    split: &Split<'_>,
    dst: &mut [f32],
) {
    let cols = w.cols();
    let groups = (&|g, n| w.groups(g, n), w.outputs());
    let dot = |g: &[u8], xs: &[F::Input<'_>], out: &mut [[f32; GROUP_ROWS]], reads| {
        k.packed_dot::<F>(g, xs, out, reads)
    };
    let tile = match k.level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Amx if F::AMX => {
            let tile = (F::amx_rows(cols), F::amx_span_bytes(cols));
            return group_outputs_by_spans(groups, cols, xs, tile, split, dst, dot);
        }
        // One row (decode): a span of groups per call, for the formats'
        // row runs (`PackedFormat::avx2_row_run`); the others take the
        // span pair by pair.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if xs.len() == 1 => {
            let tile = (1, SPAN_WEIGHT_BYTES);
            return group_outputs_by_spans(groups, cols, xs, tile, split, dst, dot);
        }
        SimdLevel::Avx512 | SimdLevel::Amx => F::PAIR_TILE_TOKENS,
        _ => TILE_TOKENS,
    };
    group_outputs(groups, cols, xs, tile, split, dst, dot);
}

/// [`PackedFormat::vnni_pair`] of any number of activation rows,
/// [`PackedFormat::PAIR_TILE_TOKENS`] at a time, with the outputs where one
/// call would put them: `out[t]` for `a`, `out[xs.len() + t]` for `b`.
///
/// # Safety
/// As [`PackedFormat::vnni`].
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn vnni_pair_in_chunks<F: PackedFormat>(
    a: &[u8],
    b: &[u8],
    xs: &[F::Input<'_>],
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
) {
    let n = xs.len();
    if n <= F::PAIR_TILE_TOKENS {
        // SAFETY: the caller guarantees the features.
        return unsafe { F::vnni_pair(a, b, xs, out, reads) };
    }
    let mut part = [[0.0f32; GROUP_ROWS]; 2 * WIDE_TILE_TOKENS];
    for (pass, rows) in xs.chunks(F::PAIR_TILE_TOKENS).enumerate() {
        let (first, len) = (pass * F::PAIR_TILE_TOKENS, rows.len());
        // SAFETY: the caller guarantees the features.
        unsafe { F::vnni_pair(a, b, rows, &mut part[..2 * len], reads.of_pass(pass)) };
        out[first..first + len].copy_from_slice(&part[..len]);
        out[n + first..n + first + len].copy_from_slice(&part[len..2 * len]);
    }
}

/// Source bytes packed between two calls of a packer's progress callback
/// (see `pack_blocks` and `PackedHalf::pack_with`).
pub const RELEASE_BYTES: usize = 4 << 20;

/// Fills `data` (row groups one after the other, each `blocks` blocks of
/// `block_bytes`) with `pack_block(group, block, bytes)`, in parallel over
/// runs of groups (at most about [`RELEASE_BYTES`] each, and four runs per
/// thread at least) in the current rayon pool (a linear op packs in its
/// own), calling `copied` with the source rows of each run once it is
/// packed, so that a caller reading a mapped source can release it as it
/// goes (runs finish in any order, on any thread); the first error, if
/// any, is returned.
pub(crate) fn pack_blocks(
    data: &mut [u8],
    block_bytes: usize,
    blocks: usize,
    copied: &(dyn Fn(Range<usize>) + Sync),
    pack_block: impl Fn(usize, usize, &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    let group_bytes = blocks * block_bytes;
    if group_bytes == 0 {
        return Ok(());
    }
    let groups = data.len() / group_bytes;
    let per_run = RELEASE_BYTES
        .div_ceil(group_bytes)
        .min(groups.div_ceil(4 * rayon::current_num_threads()))
        .max(1);
    data.par_chunks_mut(per_run * group_bytes)
        .enumerate()
        .try_for_each(|(run, bytes)| {
            let first = run * per_run;
            for (g, group) in bytes.chunks_exact_mut(group_bytes).enumerate() {
                for (i, out) in group.chunks_exact_mut(block_bytes).enumerate() {
                    pack_block(first + g, i, out)?;
                }
            }
            let packed = bytes.len() / group_bytes;
            copied(first * GROUP_ROWS..(first + packed) * GROUP_ROWS);
            Ok(())
        })
}

/// The two groups of `groups` when it holds exactly two of `group_bytes`
/// each (for the kernels that take two groups per pass, all x86-64 ones).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn as_pair(groups: &[u8], group_bytes: usize) -> Option<(&[u8], &[u8])> {
    (group_bytes > 0 && groups.len() == 2 * group_bytes).then(|| groups.split_at(group_bytes))
}

/// Runs `dot(group, rows, out, reads)` for each of the two groups `pair`
/// and each tile of at most `tile` of the activation rows `xs`: the
/// default two-group products of a [`PackedFormat`], one group at a time
/// (the outputs of the second group after those of the first). A group's
/// first tile reads as `reads`, its later ones from the cache.
#[cfg(target_arch = "x86_64")]
fn each_of_pair<A>(
    pair: [&[u8]; 2],
    xs: &[A],
    tile: usize,
    out: &mut [[f32; GROUP_ROWS]],
    reads: WeightReads,
    mut dot: impl FnMut(&[u8], &[A], &mut [[f32; GROUP_ROWS]], WeightReads),
) {
    if xs.is_empty() {
        return;
    }
    for (group, out) in pair.into_iter().zip(out.chunks_mut(xs.len())) {
        let tiles = xs.chunks(tile).zip(out.chunks_mut(tile));
        for (pass, (xs, out)) in tiles.enumerate() {
            dot(group, xs, out, reads.of_pass(pass));
        }
    }
}

/// Runs `dot(group, out)` over each group of `group_bytes` in `groups`,
/// with `rows` outputs per group in `out` (group after group); with no
/// bytes per group (no columns) every output is zero.
pub(crate) fn each_group(
    groups: &[u8],
    group_bytes: usize,
    rows: usize,
    out: &mut [[f32; GROUP_ROWS]],
    mut dot: impl FnMut(&[u8], &mut [[f32; GROUP_ROWS]]),
) {
    if group_bytes == 0 {
        out.fill([0.0; GROUP_ROWS]);
        return;
    }
    for (group, out) in groups.chunks_exact(group_bytes).zip(out.chunks_mut(rows)) {
        dot(group, out);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cpu::kernels::qkernel::tests::{kernel_or_skip, random_blocks};
    use crate::cpu::kernels::qkernel::{QuantPath, SimdLevel};
    use crate::cpu::kernels::test_util::{
        assert_within, bits, linear_reference, pool1, pool2, Rng,
    };

    /// `quantize_rows` gives every row the planes, scales and sums of the
    /// row quantized alone, one `qact::row_stride` after the other, on one
    /// thread and split over two, with one scale per block and, where the
    /// rows are whole super-blocks, per super-block.
    #[test]
    fn quantize_rows_gives_each_row_as_alone() {
        use crate::cpu::kernels::qact::SUPER_BLOCK;
        let mut rng = Rng::new(41);
        let k = kernel_or_skip(QuantPath::Int8Packed, SimdLevel::Scalar).unwrap();
        let scratch = ActivationScratch::default();
        for (rows, in_f) in [(20, 2048), (3, 576), (40, 1536)] {
            let x = rng.vec(rows * in_f, 2.0);
            let scales = [BLOCK, SUPER_BLOCK].into_iter();
            for per_scale in scales.filter(|&p| in_f.is_multiple_of(p)) {
                for pool in [pool1(), pool2()] {
                    let split = Split::new(&pool, usize::MAX);
                    let mut seen = 0;
                    quantize_rows::<WIDE>(k, (&x, in_f, per_scale), &split, &scratch, |xs| {
                        seen = xs.len();
                        let stride = crate::cpu::kernels::qact::row_stride(in_f);
                        for (t, got) in xs.iter().enumerate() {
                            let row = &x[t * in_f..][..in_f];
                            let alone = Q16Act::<WIDE>::quantize_per(row, per_scale);
                            let want = alone.row();
                            let what = format!("row {t} of {rows}, per {per_scale}");
                            assert_eq!((got.hi, got.lo), (want.hi, want.lo), "{what}");
                            assert_eq!((bits(got.d), bits(got.s)), (bits(want.d), bits(want.s)));
                            assert_eq!(got.sums, want.sums, "{what}");
                            let from_first = got.hi.as_ptr() as usize - xs[0].hi.as_ptr() as usize;
                            assert_eq!(from_first, t * stride);
                        }
                    });
                    assert_eq!(seen, rows);
                }
            }
        }
    }

    /// Checks the row ranges a packer reported through its progress
    /// callback for a matrix of `rows` rows of `row_bytes` source bytes:
    /// more than two, in whole groups, of at most about `RELEASE_BYTES` of
    /// source each, and together every row exactly once.
    pub(crate) fn check_copied_ranges(mut seen: Vec<Range<usize>>, rows: usize, row_bytes: usize) {
        seen.sort_by_key(|r| r.start);
        assert!(seen.len() > 2, "{seen:?}");
        assert_eq!(seen.first().map(|r| r.start), Some(0));
        assert_eq!(seen.last().map(|r| r.end), Some(rows));
        for pair in seen.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "{seen:?}");
        }
        for r in &seen {
            assert!(
                r.start.is_multiple_of(GROUP_ROWS) && r.end > r.start,
                "{r:?}"
            );
            assert!(
                r.len() * row_bytes <= RELEASE_BYTES + GROUP_ROWS * row_bytes,
                "{r:?}"
            );
        }
    }

    /// Stacked rows map to the parts that hold them: whole ranges within a
    /// part, ranges split where parts meet, empty parts skipped.
    #[test]
    fn stacked_rows_are_found_in_their_parts() {
        let parts = [8, 0, 16, 8];
        let ranges = |r: Range<usize>| stacked_ranges(parts, r).collect::<Vec<_>>();
        assert_eq!(ranges(0..8), [(0, 0..8)]);
        assert_eq!(ranges(4..12), [(0, 4..8), (2, 0..4)]);
        assert_eq!(ranges(6..32), [(0, 6..8), (2, 0..16), (3, 0..8)]);
        assert_eq!(ranges(24..32), [(3, 0..8)]);
        assert_eq!(ranges(5..5), []);
        assert_eq!(ranges(32..40), []);
        assert_eq!(stacked_row(parts, 7), (0, 7));
        assert_eq!(stacked_row(parts, 8), (2, 0));
        assert_eq!(stacked_row(parts, 31), (3, 7));
        let past = std::panic::catch_unwind(|| stacked_row(parts, 32));
        assert!(past.is_err(), "row 32 is past the stack");
    }

    /// Packing with a progress callback reports every row once (see
    /// [`check_copied_ranges`]) and gives the bytes of packing without.
    #[test]
    fn packing_reports_the_rows_it_copied() {
        let mut rng = Rng::new(57);
        let (rows, cols) = (8 * 500, 4 * BLOCK);
        let qt = QuantType::Q4_1;
        let w = random_blocks(&mut rng, qt, rows * cols / BLOCK);
        let m = QuantMatrix::new(qt, &w, rows, cols).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |r: Range<usize>| seen.lock().unwrap().push(r);
        let p = pool2()
            .install(|| PackedQ4::pack_with(&[m], None, &record))
            .unwrap();
        check_copied_ranges(seen.into_inner().unwrap(), rows, m.row_bytes());
        assert!(p.bytes() == PackedQ4::pack(&m).unwrap().bytes());
    }

    /// Matrices packed as one stack give the bytes of their rows packed
    /// as one matrix, report the stacked rows they copied, and are refused
    /// with named errors when they differ in type or width or a part's
    /// rows are not whole groups.
    #[test]
    fn stacked_sources_pack_as_one_matrix() {
        let mut rng = Rng::new(58);
        let (cols, qt) = (4 * BLOCK, QuantType::Q4_0);
        let rows = [8 * 300, 16, 8 * 200];
        let blocks: Vec<Vec<u8>> = rows
            .iter()
            .map(|r| random_blocks(&mut rng, qt, r * cols / BLOCK))
            .collect();
        let parts: Vec<QuantMatrix<'_>> = blocks
            .iter()
            .zip(rows)
            .map(|(b, r)| QuantMatrix::new(qt, b, r, cols).unwrap())
            .collect();
        let all = blocks.concat();
        let total = rows.iter().sum();
        let one = QuantMatrix::new(qt, &all, total, cols).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |r: Range<usize>| seen.lock().unwrap().push(r);
        let p = pool2()
            .install(|| PackedQ4::pack_with(&parts, None, &record))
            .unwrap();
        check_copied_ranges(seen.into_inner().unwrap(), total, one.row_bytes());
        assert!(p.bytes() == PackedQ4::pack(&one).unwrap().bytes());

        let refused = |parts: &[QuantMatrix<'_>], want: &str| {
            let err = PackedQ4::pack_with(parts, None, &|_| {}).err().unwrap();
            assert!(err.to_string().contains(want), "{err}");
        };
        let other = random_blocks(&mut rng, QuantType::Q4_1, 8 * cols / BLOCK);
        let q4_1 = QuantMatrix::new(QuantType::Q4_1, &other, 8, cols).unwrap();
        refused(&[parts[1], q4_1], "share a type and a width");
        let narrow = QuantMatrix::new(qt, &blocks[1][..blocks[1].len() / 2], 16, cols / 2).unwrap();
        refused(&[parts[1], narrow], "share a type and a width");
        let odd = QuantMatrix::new(qt, &blocks[1][..blocks[1].len() / 16 * 12], 12, cols).unwrap();
        refused(&[parts[1], odd], "12 rows");
        refused(&[], "no matrix");
    }

    /// The integer paths whose packed 4-, 5- and 6-bit kernels differ:
    /// 16-bit and 8-bit activation rows.
    pub(crate) const PATHS: [QuantPath; 2] = [QuantPath::Int16Activations, QuantPath::Int8Packed];

    /// Checks that each of the `rows` rows of `cols` values that `unpack`
    /// reads from its packed group (`groups(g)`) equals, bit for bit, what
    /// `qt`'s dequantizer gives the raw blocks `w`.
    pub(crate) fn check_unpacked_rows<'g>(
        qt: QuantType,
        w: &[u8],
        [rows, cols]: [usize; 2],
        groups: &dyn Fn(usize) -> &'g [u8],
        unpack: fn(&[u8], usize, &mut [f32]),
    ) {
        let mut want = vec![0.0f32; rows * cols];
        qt.dequantize_blocks(w, &mut want);
        for r in 0..rows {
            let mut got = vec![f32::NAN; cols];
            unpack(groups(r / GROUP_ROWS), r % GROUP_ROWS, &mut got);
            assert_eq!(got, want[r * cols..(r + 1) * cols], "{qt} row {r}");
        }
    }

    /// Each row unpacked from the packed layout has exactly the values the
    /// Q4_0 / Q4_1 dequantizer gives the unpacked row.
    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(43);
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let (rows, cols) = (24, 3 * BLOCK);
            let w = random_blocks(&mut rng, qt, rows * cols / BLOCK);
            let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
            let groups = |g| p.groups(g, 1);
            check_unpacked_rows(qt, &w, [rows, cols], &groups, PackedQ4::unpack_row);
        }
    }

    /// Packing keeps every value: the portable packed dot with wide
    /// activations equals the f64 dot of each unpacked row's dequantized
    /// weights with the dequantized activations.
    #[test]
    fn packed_dot_equals_row_dot() {
        let mut rng = Rng::new(41);
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let (rows, nb) = (16, 5);
            let w = random_blocks(&mut rng, qt, rows * nb);
            let m = QuantMatrix::new(qt, &w, rows, nb * BLOCK).unwrap();
            let p = PackedQ4::pack(&m).unwrap();
            let x = Q16Act::<WIDE>::quantize(&rng.vec(nb * BLOCK, 1.0));
            let xr = x.row();
            let xf: Vec<f64> = (0..nb * BLOCK)
                .map(|i| xr.value(i) as f64 * xr.d[i / BLOCK] as f64)
                .collect();
            let mut wf = vec![0.0f32; rows * nb * BLOCK];
            qt.dequantize_blocks(&w, &mut wf);
            for g in 0..rows / GROUP_ROWS {
                let mut out = [[0.0; GROUP_ROWS]];
                group_dot(p.groups(g, 1), &[xr], &mut out);
                for (r, &got) in out[0].iter().enumerate() {
                    let row = &wf[(g * GROUP_ROWS + r) * nb * BLOCK..][..nb * BLOCK];
                    let want: f64 = row.iter().zip(&xf).map(|(&a, &b)| a as f64 * b).sum();
                    let mag: f64 = row
                        .iter()
                        .zip(&xf)
                        .map(|(&a, &b)| (a as f64 * b).abs())
                        .sum();
                    assert!((got as f64 - want).abs() <= 1e-5 * mag, "{qt} {g} {r}");
                }
            }
        }
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * 20];
        let m = QuantMatrix::new(QuantType::Q4_1, &w, 7, 32).unwrap();
        let err = PackedQ4::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 34];
        let m = QuantMatrix::new(QuantType::Q8_0, &w, 8, 32).unwrap();
        let err = PackedQ4::pack(&m).err().unwrap();
        assert!(err.to_string().contains("q8_0"), "{err}");
        let mut w = vec![0u8; 8 * 18];
        w[..2].copy_from_slice(&f16::from_f32(10000.0).to_le_bytes());
        let m = QuantMatrix::new(QuantType::Q4_0, &w, 8, 32).unwrap();
        let err = PackedQ4::pack(&m).err().unwrap();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    /// A packed linear layer run on raw blocks: `(kernel, weights, x, rows,
    /// bias, y, pool)`, packing the weights itself.
    pub(crate) type PackedLinear = dyn Fn(
        QuantKernel,
        &QuantMatrix<'_>,
        &[f32],
        usize,
        Option<&[f32]>,
        &mut [f32],
        &ThreadPool,
    );

    /// Checks `linear` on `path` at every level and thread count against
    /// the f64 product of the dequantized weights (`qt` blocks made by
    /// `blocks`) with the activations as the path sees them (the f32
    /// values, or their 8-bit round trip on [`QuantPath::Int8Packed`] with
    /// one scale per block of 32),
    /// within `1e-4 · (Σ|x·w| + |b|)`, for each `(rows, blocks per row,
    /// out_f)` case, with a bias on odd row counts.
    pub(crate) fn check_packed_linear(
        path: QuantPath,
        rng: &mut Rng,
        qt: QuantType,
        blocks: &dyn Fn(&mut Rng, usize) -> Vec<u8>,
        cases: &[(usize, usize, usize)],
        linear: &PackedLinear,
    ) {
        check_packed_linear_per(path, rng, (qt, BLOCK), blocks, cases, linear)
    }

    /// [`check_packed_linear`] for a layer whose 8-bit activation rows
    /// have one scale per `per_scale` values.
    pub(crate) fn check_packed_linear_per(
        path: QuantPath,
        rng: &mut Rng,
        (qt, per_scale): (QuantType, usize),
        blocks: &dyn Fn(&mut Rng, usize) -> Vec<u8>,
        cases: &[(usize, usize, usize)],
        linear: &PackedLinear,
    ) {
        for level in SimdLevel::FASTEST_FIRST {
            let Some(k) = kernel_or_skip(path, level) else {
                continue;
            };
            for pool in [pool1(), pool2()] {
                for &(rows, nb, out_f) in cases {
                    let in_f = nb * BLOCK;
                    let w = blocks(rng, out_f * nb);
                    let mut wf = vec![0.0; out_f * in_f];
                    qt.dequantize_blocks(&w, &mut wf);
                    let m = QuantMatrix::new(qt, &w, out_f, in_f).unwrap();
                    let x = rng.vec(rows * in_f, 1.0);
                    let b = rng.vec(out_f, 1.0);
                    let bias = (rows % 2 == 1).then_some(&b[..]);
                    let mut y = vec![f32::NAN; rows * out_f];
                    linear(k, &m, &x, rows, bias, &mut y, &pool);
                    let seen = match path {
                        QuantPath::Int8Packed => eight_bit_round_trip(&x, per_scale),
                        _ => x,
                    };
                    let (want, mag) = linear_reference(&seen, rows, in_f, &wf, out_f, bias);
                    let what = format!("{path:?} {level:?} {qt} rows={rows} out={out_f}");
                    assert_within(&y, &want, &mag, 1e-4, &what);
                }
            }
        }
    }

    /// `x` quantized to 8 bits with one scale per `per_scale` values and
    /// back.
    fn eight_bit_round_trip(x: &[f32], per_scale: usize) -> Vec<f32> {
        let q = Q16Act::<BYTE>::quantize_per(x, per_scale);
        let r = q.row();
        r.hi.iter()
            .enumerate()
            .map(|(i, &q)| q as f32 * r.d[i / BLOCK])
            .collect()
    }

    /// The packed linear layer matches the reference (see
    /// [`check_packed_linear`]) for one row (decode), row counts that do
    /// and do not fill the token tile, and enough values to quantize in
    /// parallel.
    #[test]
    fn packed_linear_matches_reference() {
        let mut rng = Rng::new(42);
        let cases = [
            (1, 3, 8),
            (1, 18, 200),
            (5, 7, 64),
            (70, 9, 136),
            (300, 2, 16),
            (130, 32, 16),
        ];
        for (qt, path) in [QuantType::Q4_0, QuantType::Q4_1]
            .into_iter()
            .flat_map(|qt| PATHS.map(|p| (qt, p)))
        {
            let blocks = |rng: &mut Rng, n| random_blocks(rng, qt, n);
            check_packed_linear(
                path,
                &mut rng,
                qt,
                &blocks,
                &cases,
                &|k, m, x, rows, b, y, pool| {
                    packed_linear(
                        k,
                        x,
                        rows,
                        &PackedQ4::pack(m).unwrap(),
                        b,
                        y,
                        pool,
                        &ActivationScratch::default(),
                    )
                },
            );
        }
    }

    /// A packed linear layer bound to its weights and bias: `(kernel, x,
    /// rows, y, pool)`.
    pub(crate) type BoundLinear<'a> =
        dyn Fn(QuantKernel, &[f32], usize, &mut [f32], &ThreadPool) + 'a;

    /// Batch invariance on `path` at every level this CPU runs: each of
    /// the `rows` rows of `x` gets from the whole batch on two threads
    /// exactly the `out_f` outputs it gets alone on one, whatever shares
    /// its token tile or row block and however the groups are split over
    /// threads. With `portable_bits`, every level's batch also equals the
    /// portable kernel's bit for bit.
    pub(crate) fn check_rows_alone(
        path: QuantPath,
        linear: &BoundLinear<'_>,
        x: &[f32],
        rows: usize,
        out_f: usize,
        portable_bits: bool,
        what: &str,
    ) {
        let in_f = x.len() / rows;
        let scalar = kernel_or_skip(path, SimdLevel::Scalar).unwrap();
        let mut portable = vec![f32::NAN; rows * out_f];
        linear(scalar, x, rows, &mut portable, &pool1());
        for level in SimdLevel::FASTEST_FIRST {
            let Some(k) = kernel_or_skip(path, level) else {
                continue;
            };
            let mut all = vec![f32::NAN; rows * out_f];
            linear(k, x, rows, &mut all, &pool2());
            if portable_bits {
                assert_eq!(
                    all, portable,
                    "{what}: {level:?} differs from the portable kernel"
                );
            }
            for (t, want) in all.chunks_exact(out_f).enumerate() {
                let mut one = vec![f32::NAN; out_f];
                linear(k, &x[t * in_f..(t + 1) * in_f], 1, &mut one, &pool1());
                assert_eq!(one, want, "{what}: {level:?} row {t} of {rows}");
            }
        }
    }

    /// Batch invariance on both paths (see [`check_rows_alone`]) of the
    /// packed Q4 layer.
    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(43);
        for (qt, path) in [QuantType::Q4_0, QuantType::Q4_1]
            .into_iter()
            .flat_map(|qt| PATHS.map(|p| (qt, p)))
        {
            for &(rows, nb, out_f) in &[(3, 7, 64), (6, 18, 200), (131, 4, 24)] {
                let in_f = nb * BLOCK;
                let w = random_blocks(&mut rng, qt, out_f * nb);
                let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, out_f, in_f).unwrap()).unwrap();
                let x = rng.vec(rows * in_f, 1.0);
                let b = rng.vec(out_f, 1.0);
                let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
                    packed_linear(
                        k,
                        x,
                        rows,
                        &p,
                        Some(&b),
                        y,
                        pool,
                        &ActivationScratch::default(),
                    )
                };
                check_rows_alone(path, linear, &x, rows, out_f, false, &qt.to_string());
            }
        }
    }

    /// Decode's row runs of packed Q4 groups (see [`check_row_runs`]), for
    /// 16-bit and 8-bit rows, at SmolLM2's width and an odd one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_row_run_gives_each_group_its_own_bits() {
        let mut rng = Rng::new(47);
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            for (groups_n, nb) in [(5, 18), (3, 7)] {
                let (rows, cols) = (groups_n * GROUP_ROWS, nb * BLOCK);
                let w = random_blocks(&mut rng, qt, rows * nb);
                let p = PackedQ4::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
                let groups = (p.groups(0, groups_n), groups_n);
                let x = rng.vec(cols, 3.0);
                let wide = Q16Act::<WIDE>::quantize(&x);
                check_row_runs::<Q4Format<WIDE>>(groups, wide.row(), &format!("{qt} 16-bit"));
                let byte = Q16Act::<BYTE>::quantize(&x);
                check_row_runs::<Q4Format<BYTE>>(groups, byte.row(), &format!("{qt} 8-bit"));
            }
        }
    }

    /// Only the first tile of rows over each span of groups is told that
    /// its weights come from memory (and so prefetches them); the other
    /// tiles over the span find them in cache. Every tile goes through
    /// every pair of groups once, on one thread and on two.
    #[test]
    fn only_the_first_tile_over_a_span_reads_from_memory() {
        // Groups of half a span: each pair of groups is a span of its own.
        let group_bytes = SPAN_WEIGHT_BYTES / 2;
        let n_groups = 6;
        let weights = vec![0u8; n_groups * group_bytes];
        let groups = |g: usize, n: usize| &weights[g * group_bytes..(g + n) * group_bytes];
        for rows in [1, 4, 10] {
            let xs: Vec<usize> = (0..rows).collect();
            for pool in [pool1(), pool2()] {
                let split = Split::new(&pool, usize::MAX);
                let mut dst = vec![0.0f32; rows * n_groups * GROUP_ROWS];
                let seen = std::sync::Mutex::new(Vec::new());
                group_outputs(
                    (&groups, RowOutputs::Each),
                    64,
                    &xs,
                    TILE_TOKENS,
                    &split,
                    &mut dst,
                    |g, xs, out, reads| {
                        let pair = (g.as_ptr() as usize - weights.as_ptr() as usize) / group_bytes;
                        seen.lock()
                            .unwrap()
                            .push((pair, xs[0], g.len() / group_bytes, reads));
                        out.fill([0.0; GROUP_ROWS]);
                    },
                );
                let mut seen = seen.into_inner().unwrap();
                seen.sort_by_key(|&(pair, row, ..)| (pair, row));
                let want: Vec<_> = (0..n_groups)
                    .step_by(2)
                    .flat_map(|pair| (0..rows).step_by(TILE_TOKENS).map(move |row| (pair, row)))
                    .map(|(pair, row)| {
                        let reads = if row == 0 {
                            WeightReads::FromMemory
                        } else {
                            WeightReads::FromCache
                        };
                        (pair, row, 2, reads)
                    })
                    .collect();
                assert_eq!(seen, want, "{rows} rows");
            }
        }
    }

    /// One activation scratch shared by calls of other widths and row
    /// counts, on both paths, gives the bits of a fresh scratch per call:
    /// whatever the buffers held from a wider or longer call (or from the
    /// other path's planes), the kernels read only what the call wrote.
    #[test]
    fn a_reused_scratch_gives_the_bits_of_a_fresh_one() {
        use crate::cpu::kernels::packed_q6k::{packed_q6k_linear, PackedQ6K};
        use crate::cpu::kernels::packed_q8::{packed_q8_linear, PackedQ8};
        let mut rng = Rng::new(61);
        let pool = pool2();
        let shared = ActivationScratch::default();
        let cases = [
            (QuantType::Q4_1, 48, 256, 130),
            (QuantType::Q8_0, 24, 96, 3),
            (QuantType::Q6K, 16, 512, 129),
            (QuantType::Q4_1, 16, 64, 1),
            (QuantType::Q8_0, 32, 512, 131),
        ];
        let cases = cases.into_iter().flat_map(|c| PATHS.map(|p| (c, p)));
        for ((qt, out_f, in_f, rows), path) in cases {
            let k = QuantKernel::new(path);
            let w = random_blocks(&mut rng, qt, out_f * in_f / qt.block_len());
            let m = QuantMatrix::new(qt, &w, out_f, in_f).unwrap();
            let x = rng.vec(rows * in_f, 1.0);
            let run = |scratch: &ActivationScratch| {
                let mut y = vec![0.0f32; rows * out_f];
                match qt {
                    QuantType::Q4_1 => {
                        let p = PackedQ4::pack(&m).unwrap();
                        packed_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                    }
                    QuantType::Q8_0 => {
                        let p = PackedQ8::pack(&m).unwrap();
                        packed_q8_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                    }
                    _ => {
                        let p = PackedQ6K::pack(&m).unwrap();
                        packed_q6k_linear(k, &x, rows, &p, None, &mut y, &pool, scratch);
                    }
                }
                bits(&y)
            };
            let fresh = run(&ActivationScratch::default());
            assert_eq!(
                run(&shared),
                fresh,
                "{qt} {path:?} {out_f}x{in_f}, {rows} rows"
            );
        }
    }

    /// Checks the group products of format `F` over `groups` (two packed
    /// groups): for one group and for both (the two-group kernels) and one
    /// to all of the rows `xs` (at most the format's tile), every level of
    /// `levels` this CPU runs gives the first such level's bits, whether it
    /// prefetches its weights or not, and each level's two-group product
    /// each group's own ([`check_pair_equals_groups_alone`]).
    pub(crate) fn check_group_products<F: PackedFormat>(
        groups: &[u8],
        xs: &[F::Input<'_>],
        levels: &[SimdLevel],
        what: &str,
    ) {
        let kernels: Vec<QuantKernel> = levels
            .iter()
            .filter_map(|&l| kernel_or_skip(QuantPath::Int16Activations, l))
            .collect();
        let Some(first) = kernels.first() else {
            return;
        };
        let group_bytes = groups.len() / 2;
        for n in 1..=2 {
            for t in 1..=xs.len() {
                let groups = &groups[..n * group_bytes];
                let mut want = vec![[f32::NAN; GROUP_ROWS]; n * t];
                first.packed_dot::<F>(groups, &xs[..t], &mut want, WeightReads::FromCache);
                for k in &kernels {
                    for reads in [WeightReads::FromMemory, WeightReads::FromCache] {
                        let mut got = vec![[f32::NAN; GROUP_ROWS]; n * t];
                        k.packed_dot::<F>(groups, &xs[..t], &mut got, reads);
                        let level = k.level();
                        assert_eq!(
                            got, want,
                            "{what}: {level:?} {reads:?}, {n} groups, {t} rows"
                        );
                    }
                }
            }
        }
        for k in &kernels {
            check_pair_equals_groups_alone::<F>(*k, groups, xs, what);
        }
    }

    /// At the AVX2 level (skipped, with a note, on a CPU without it), one
    /// activation row `x` through every run of consecutive groups of
    /// `groups` (`groups_n` of them) in one call of `packed_dot` (the
    /// format's [`PackedFormat::avx2_row_run`], or pair by pair for a
    /// format without one) gets, whether the run prefetches or not, each
    /// group's outputs from the one-group kernel ([`PackedFormat::avx2`])
    /// bit for bit.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn check_row_runs<F: PackedFormat>(
        (groups, groups_n): (&[u8], usize),
        x: F::Input<'_>,
        what: &str,
    ) {
        let Some(k) = kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Avx2) else {
            return;
        };
        let group_bytes = groups.len() / groups_n;
        let one = std::slice::from_ref(&x);
        let alone: Vec<[f32; GROUP_ROWS]> = groups
            .chunks_exact(group_bytes)
            .map(|group| {
                let mut out = [[f32::NAN; GROUP_ROWS]];
                // SAFETY: the AVX2 level is available (checked above), so
                // this CPU has AVX2, FMA and F16C.
                unsafe { F::avx2(group, one, &mut out, WeightReads::FromCache) };
                out[0]
            })
            .collect();
        for first in 0..groups_n {
            for n in 1..=groups_n - first {
                let run = &groups[first * group_bytes..(first + n) * group_bytes];
                for reads in [WeightReads::FromMemory, WeightReads::FromCache] {
                    let mut got = vec![[f32::NAN; GROUP_ROWS]; n];
                    k.packed_dot::<F>(run, one, &mut got, reads);
                    assert_eq!(
                        got,
                        alone[first..first + n],
                        "{what}: groups {first}..{}, {reads:?}",
                        first + n
                    );
                }
            }
        }
    }

    /// At the AMX level (skipped, with a note, on a CPU without it), the
    /// tile product of the groups `groups` (an even number, `groups_n` of
    /// them) with the rows `xs` (rows of one buffer, in order; any number,
    /// for formats whose tile kernel takes many tiles and the rows after
    /// them) is taken, and each row's outputs equal the AVX-512 products
    /// of the row alone, bit for bit.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn check_tiles_take_rows<F: PackedFormat>(
        (groups, groups_n): (&[u8], usize),
        xs: &[F::Input<'_>],
        what: &str,
    ) {
        let path = QuantPath::Int16Activations;
        if QuantKernel::with_level(path, SimdLevel::Amx).is_none() {
            eprintln!("{what}: no AMX tiles on this CPU, the tile products were not run");
            return;
        }
        let avx512 = QuantKernel::with_level(path, SimdLevel::Avx512).expect("AMX has AVX-512");
        let (n, group_bytes) = (xs.len(), groups.len() / groups_n);
        let mut got = vec![[f32::NAN; GROUP_ROWS]; groups_n * n];
        // SAFETY: the AMX level is available (checked above): the AVX-512
        // level's features and AMX tiles this process may use.
        let took = unsafe { F::amx_pairs(groups, group_bytes, xs, &mut got) };
        assert!(took, "{what}, {n} rows: tiles taken");
        for (t, x) in xs.iter().enumerate() {
            let mut alone = vec![[f32::NAN; GROUP_ROWS]; groups_n];
            let one = std::slice::from_ref(x);
            avx512.packed_dot::<F>(groups, one, &mut alone, WeightReads::FromCache);
            for (g, want) in alone.iter().enumerate() {
                assert_eq!(got[g * n + t], *want, "{what}: row {t} of {n}, group {g}");
            }
        }
    }

    /// At the AMX level (skipped, with a note, on a CPU without it), the
    /// product of the two packed groups `groups` with the 16 rows `xs`
    /// (rows of one buffer, in order) equals the AVX-512 products of each
    /// row alone, bit for bit, for the rows in order and reversed (a
    /// negative stride), both through the tiles where the format has a tile
    /// product ([`PackedFormat::AMX`]), and with two rows swapped (not
    /// evenly spaced: the AVX-512 products).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn check_tile_products<F: PackedFormat>(
        groups: &[u8],
        xs: &[F::Input<'_>],
        what: &str,
    ) {
        let path = QuantPath::Int16Activations;
        let Some(amx) = QuantKernel::with_level(path, SimdLevel::Amx) else {
            eprintln!("{what}: no AMX tiles on this CPU, the tile products were not run");
            return;
        };
        let avx512 = QuantKernel::with_level(path, SimdLevel::Avx512).expect("AMX has AVX-512");
        let n = xs.len();
        assert_eq!(
            n,
            super::super::simd::amx::TILE_ROWS,
            "{what}: a tile of rows"
        );
        let group_bytes = groups.len() / 2;
        let reads = WeightReads::FromMemory;
        let alone: Vec<[[f32; GROUP_ROWS]; 2]> = xs
            .iter()
            .map(|x| {
                let mut out = [[f32::NAN; GROUP_ROWS]; 2];
                avx512.packed_dot::<F>(groups, std::slice::from_ref(x), &mut out, reads);
                out
            })
            .collect();
        let mut swapped: Vec<usize> = (0..n).collect();
        swapped.swap(3, 9);
        let orders = [
            ("in order", (0..n).collect::<Vec<_>>(), F::AMX),
            ("reversed", (0..n).rev().collect(), F::AMX),
            ("two swapped", swapped, false),
        ];
        for (name, order, tiles) in orders {
            let rows: Vec<F::Input<'_>> = order.iter().map(|&t| xs[t]).collect();
            let mut direct = vec![[f32::NAN; GROUP_ROWS]; 2 * n];
            // SAFETY: the AMX level is available (`with_level` above): the
            // AVX-512 level's features and AMX tiles this process may use.
            let took_tiles = unsafe { F::amx_pairs(groups, group_bytes, &rows, &mut direct) };
            assert_eq!(took_tiles, tiles, "{what}, rows {name}: tile product taken");
            let mut out = vec![[f32::NAN; GROUP_ROWS]; 2 * n];
            amx.packed_dot::<F>(groups, &rows, &mut out, reads);
            for (i, &t) in order.iter().enumerate() {
                for (g, want) in alone[t].iter().enumerate() {
                    let got = out[g * n + i];
                    assert_eq!(
                        got.map(f32::to_bits),
                        want.map(f32::to_bits),
                        "{what}, rows {name}, row {t}, group {g}"
                    );
                    if tiles {
                        assert_eq!(direct[g * n + i].map(f32::to_bits), want.map(f32::to_bits));
                    }
                }
            }
        }
    }

    /// The two-group product of kernel `k` over `groups` (two packed
    /// groups) equals each group's own product, bit for bit, for one to
    /// all of the rows `xs`: a task split that leaves a group without its
    /// neighbour must not change its outputs.
    pub(crate) fn check_pair_equals_groups_alone<F: PackedFormat>(
        k: QuantKernel,
        groups: &[u8],
        xs: &[F::Input<'_>],
        what: &str,
    ) {
        let group_bytes = groups.len() / 2;
        for t in 1..=xs.len() {
            let mut pair = vec![[f32::NAN; GROUP_ROWS]; 2 * t];
            k.packed_dot::<F>(groups, &xs[..t], &mut pair, WeightReads::FromMemory);
            for (g, want) in pair.chunks_exact(t).enumerate() {
                let mut alone = vec![[f32::NAN; GROUP_ROWS]; t];
                let group = &groups[g * group_bytes..][..group_bytes];
                k.packed_dot::<F>(group, &xs[..t], &mut alone, WeightReads::FromCache);
                assert_eq!(
                    alone,
                    want,
                    "{what}: {:?}, group {g} alone, {t} rows",
                    k.level()
                );
            }
        }
    }

    /// The AVX-VNNI and AVX-512 VNNI group products of rows split at
    /// `SHIFT` equal the AVX2 one bit for bit (the same integer block sums,
    /// the same float steps), for one group (256-bit) and two (512-bit, and
    /// the AVX2 two-group kernel) and one to four activation rows, and each
    /// level's two-group product equals the groups' own.
    fn check_levels<const SHIFT: u32>(rng: &mut Rng) {
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let nb = 9;
            let w = random_blocks(rng, qt, 2 * GROUP_ROWS * nb);
            let m = QuantMatrix::new(qt, &w, 2 * GROUP_ROWS, nb * BLOCK).unwrap();
            let p = PackedQ4::pack(&m).unwrap();
            let acts: Vec<Q16Act<SHIFT>> = (0..TILE_TOKENS)
                .map(|_| Q16Act::quantize(&rng.vec(nb * BLOCK, 3.0)))
                .collect();
            let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
            let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
            let what = format!("{qt} split at {SHIFT}");
            check_group_products::<Q4Format<SHIFT>>(p.groups(0, 2), &rows, &levels, &what);
            #[cfg(target_arch = "x86_64")]
            {
                let tile = super::super::simd::amx::TILE_ROWS;
                let act = Q16Act::<SHIFT>::quantize(&rng.vec(tile * nb * BLOCK, 3.0));
                let rows: Vec<Q16Row<'_, SHIFT>> = (0..tile)
                    .map(|t| act.row().sub_row(t, nb * BLOCK))
                    .collect();
                check_tile_products::<Q4Format<SHIFT>>(p.groups(0, 2), &rows, &what);
            }
        }
    }

    #[test]
    fn vnni_group_dot_equals_avx2() {
        let mut rng = Rng::new(44);
        check_levels::<WIDE>(&mut rng);
        check_levels::<BYTE>(&mut rng);
    }

    /// Row counts for [`check_tiles_take_rows`]: one, three and eight tiles
    /// of rows, with and without rows after the last whole tile.
    #[cfg(target_arch = "x86_64")]
    pub(crate) const MANY_TILE_ROWS: [usize; 4] = [16, 21, 48, 8 * 16 + 5];

    /// The tile kernel of `F`, a format of `types`' blocks whose groups
    /// `pack` gives (all `groups_n` of a matrix), takes many tiles of rows
    /// at once (see [`MANY_TILE_ROWS`]), over two spans of blocks and part
    /// of a third ([`check_tiles_take_rows`]).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn check_blocks_take_many_tiles<F, const SHIFT: u32>(
        rng: &mut Rng,
        types: &[QuantType],
        pack: impl Fn(&QuantMatrix<'_>, usize) -> Vec<u8>,
    ) where
        F: for<'a> PackedFormat<Input<'a> = Q16Row<'a, SHIFT>>,
    {
        let (groups_n, nb) = (4, 2 * super::super::simd::amx::SPAN + 2);
        for &qt in types {
            let w = random_blocks(rng, qt, groups_n * GROUP_ROWS * nb);
            let m = QuantMatrix::new(qt, &w, groups_n * GROUP_ROWS, nb * BLOCK).unwrap();
            let groups = pack(&m, groups_n);
            let what = format!("{qt} split at {SHIFT}");
            for n in MANY_TILE_ROWS {
                let act = Q16Act::<SHIFT>::quantize(&rng.vec(n * nb * BLOCK, 3.0));
                let rows: Vec<Q16Row<'_, SHIFT>> =
                    (0..n).map(|t| act.row().sub_row(t, nb * BLOCK)).collect();
                check_tiles_take_rows::<F>((&groups, groups_n), &rows, &what);
            }
        }
    }

    /// The Q4 tile kernel takes many tiles of rows at once.
    #[cfg(target_arch = "x86_64")]
    fn check_many_tiles<const SHIFT: u32>(rng: &mut Rng) {
        let types = [QuantType::Q4_0, QuantType::Q4_1];
        check_blocks_take_many_tiles::<Q4Format<SHIFT>, SHIFT>(rng, &types, |m, groups_n| {
            PackedQ4::pack(m).unwrap().groups(0, groups_n).to_vec()
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tiles_take_many_rows() {
        let mut rng = Rng::new(45);
        check_many_tiles::<WIDE>(&mut rng);
        check_many_tiles::<BYTE>(&mut rng);
    }
}
