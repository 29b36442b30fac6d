//! Weights repacked at load in groups of eight rows for the integer
//! kernels: what every packed format shares (`PackedData`, the
//! `PackedFormat` kernels), the Q4_0 / Q4_1 format (`q4`), how sources are
//! packed (`packing`), and the linear-layer frame that runs a format's
//! kernels over row groups, tiles of activation rows and threads
//! (`outputs`).
//!
//! A packed Q4 matrix stores its rows in groups of eight, block by block:
//! for each group and each block of 32 columns, 160 bytes hold the eight
//! rows' f16 scales `d`, their f16 offsets `m` (Q4_0's `-8·d`), then four
//! 32-byte chunks where chunk `j` holds the `j`-th 4-byte word of each
//! row's nibbles: bytes `4r..4r + 4` of chunk `j` are bytes `4j..4j + 4` of
//! row `r`'s block, whose low nibbles are the values at columns
//! `4j..4j + 4` and high nibbles those at `16 + 4j..16 + 4j + 4`. One
//! 256-bit load therefore holds four consecutive weights of all eight rows,
//! and one broadcast 4-byte activation word multiplies all of them at once:
//! the block's sums for the eight rows end up in the eight lanes of one
//! register, with no horizontal sums and one F16C conversion per eight
//! scales. The other packed formats also keep eight rows per group, block
//! by block (`PackedData`).

mod outputs;
mod packing;
mod q4;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(target_arch = "x86_64")]
use outputs::each_of_pair;
#[cfg(target_arch = "x86_64")]
pub(crate) use outputs::{as_pair, vnni_pair_in_chunks};
pub(crate) use outputs::{
    by_row_blocks, each_group, fill_by_rows, group_outputs, packed_group_outputs, quantize_rows,
    wide_packed_linear,
};
pub use packing::RELEASE_BYTES;
pub(crate) use packing::{pack_blocks, stacked_ranges, stacked_row, SourceRows};
pub(crate) use q4::nibble_block_sum;
pub use q4::{packed_linear, PackedQ4};

use mllm_core::file::TensorData;
use mllm_core::op::Activation;
use mllm_core::{DType, Error, Result};

use super::qact::BLOCK;
use super::weight_memory::WeightMemory;

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
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
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
