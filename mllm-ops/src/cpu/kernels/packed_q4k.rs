//! Q4_K weights repacked at load for the integer kernels (16-bit
//! activations, or 8-bit ones on `QuantPath::Int8Packed`), the frame
//! every K-quant layout with the same super-block header shares (Q4_K
//! here, Q5_K in `packed_q5k`), and the linear layer over them.
//!
//! The nibbles take the packed Q4 layout (see `packed`): rows in groups of
//! eight, and per block of 32 columns four 32-byte chunks where chunk `j`
//! holds the `j`-th 4-byte word of each row's Q4_0-ordered nibbles (low
//! nibble of byte `i` the value at column `i`, high nibble the one at
//! `16 + i`). The scales stay in Q4_K's form, one super-block of 256
//! columns at a time, so that a packed matrix is barely larger than the
//! Q4_K one (1184 bytes per group and super-block against 8 × 144):
//!
//! ```text
//! [d: 8 × f16][dmin: 8 × f16][sc: 8 sub-blocks × 8 rows × u8]
//! [m: 8 sub-blocks × 8 rows × u8][bits: 8 sub-blocks × BLOCK_BITS bytes]
//! ```
//!
//! The activation rows these kernels take have one scale `d_x` per
//! super-block (`qact::SUPER_BLOCK`), as ggml's Q8_K has, so that a
//! super-block's sub-blocks add up as integers: with the 16-bit values
//! `q_x = 2^SHIFT·hi + lo` of a row split at `SHIFT` and its exact block
//! sums `Σ q_x`, row `r` gets per super-block
//!
//! ```text
//! H = Σ_j sc_j·Σ q·hi    L = Σ_j sc_j·Σ q·lo    M = Σ_j m_j·Σ q_x
//! acc = fma(2^SHIFT·H + L, d·d_x, acc)    acc = fma(M, −dmin·d_x, acc)
//! ```
//!
//! (`2^SHIFT·H + L` is one `fma` in f32; `BYTE` rows have `L = 0`).
//! Each integer is exact in 32 bits (`|H|, |L| < 2^26`, `|M| < 2^30`), so
//! every level that forms them, by sub-block sums times scales or by tile
//! products of the weights with their scales folded in (`amx_kquant`),
//! and then takes the same float steps, gives the same bits. A layout
//! differs only in its sub-blocks' bits (`SubBlockBits`).

use std::marker::PhantomData;
use std::ops::Range;

use half::f16;
use mllm_core::Result;
use rayon::ThreadPool;

#[cfg(target_arch = "x86_64")]
use super::packed::WeightReads;
use super::packed::{
    nibble_block_sum, pack_blocks, wide_packed_linear, PackedData, PackedFormat, SourceRows,
    GROUP_ROWS, TILE_TOKENS, WIDE_TILE_TOKENS,
};
use super::qact::{ActivationScratch, Q16Row, BLOCK, BYTE, SUPER_BLOCK, WIDE};
use super::qkernel::{QuantKernel, QuantPath};
use super::qmatmul::QuantMatrix;
#[cfg(target_arch = "x86_64")]
use super::simd::amx::{FullTiles, TILE_ROWS};
#[cfg(target_arch = "x86_64")]
use super::simd::amx_kquant::{full_tiles_then_rest, RowTiles, MAX_TILES};
use super::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q4_k, QuantType};

/// Sub-blocks of 32 columns per super-block.
pub(crate) const SUB_BLOCKS: usize = q4_k::BLOCK_LEN / BLOCK;
/// Offset of the eight rows' 6-bit scales, sub-block after sub-block.
pub(crate) const SCALES_AT: usize = 4 * GROUP_ROWS;
/// Offset of the eight rows' 6-bit minimums, sub-block after sub-block.
pub(crate) const MINS_AT: usize = SCALES_AT + SUB_BLOCKS * GROUP_ROWS;
/// Offset of the sub-blocks' bits.
pub(crate) const BITS_AT: usize = MINS_AT + SUB_BLOCKS * GROUP_ROWS;

/// The sub-block bits of a packed layout under the header above: Q4_K's
/// nibbles ([`Nibbles`]) or Q5_K's five-bit values (`packed_q5k`), with
/// the kernels that read them.
pub(crate) trait SubBlockBits: Send + Sync + 'static {
    /// The block type that packs into this layout.
    const QT: QuantType;
    /// Bytes of bits per group and sub-block.
    const BLOCK_BITS: usize;
    /// Bytes of one group per super-block.
    const SUPER_BYTES: usize = BITS_AT + SUB_BLOCKS * Self::BLOCK_BITS;

    /// Writes the values of super-block `b` (one row's, in [`Self::QT`])
    /// as row `r` into `bits`, the sub-blocks' bits of a packed group
    /// super-block.
    fn pack_bits(b: &[u8], r: usize, bits: &mut [u8]);
    /// Row `r`'s value at column `col` (`0..32`) of one sub-block's bits.
    #[cfg(test)]
    fn value(bits: &[u8], r: usize, col: usize) -> u8;
    /// Row `r`'s exact `Σ q·(2^SHIFT·hi + lo)` over one sub-block's bits
    /// and the two planes of one activation block split at `SHIFT`.
    fn block_sum<const SHIFT: u32>(bits: &[u8], r: usize, hi: &[i8], lo: &[i8]) -> i32;
    /// The AVX2 group product (as `PackedFormat::avx2`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2<const SHIFT: u32>(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// The AVX-VNNI group product (as `PackedFormat::avx_vnni`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C and AVX-VNNI.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx_vnni<const SHIFT: u32>(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// The AVX-512 VNNI group product (as `PackedFormat::vnni`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA, F16C, AVX-512F/VL/BW and AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni<const SHIFT: u32>(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// The two-group AVX-512 VNNI product (as `PackedFormat::vnni_pair`).
    ///
    /// # Safety
    /// As [`SubBlockBits::vnni`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni_pair<const SHIFT: u32>(
        a: &[u8],
        b: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    );
    /// The AMX products of each group pair in `groups` with the row tiles
    /// `rows`, into `out` with `n` rows per group (as `amx_kquant`'s
    /// `pairs`).
    ///
    /// # Safety
    /// As [`SubBlockBits::vnni`] (the tiles are configured while `tiles`
    /// lives).
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs<const SHIFT: u32>(
        tiles: &FullTiles,
        groups: &[u8],
        group_bytes: usize,
        rows: &RowTiles<'_, '_, SHIFT>,
        out: (&mut [[f32; GROUP_ROWS]], usize),
    );
}

/// A K-quant matrix `[rows, cols]` repacked in groups of eight rows (see
/// the module documentation), its sub-block bits those of `B`.
pub(crate) struct PackedKQuant<B> {
    data: PackedData,
    bits: PhantomData<B>,
}

/// A Q4_K matrix `[rows, cols]` repacked in groups of eight rows (see the
/// module documentation).
pub struct PackedQ4K {
    packed: PackedKQuant<Nibbles>,
}

impl PackedQ4K {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: mllm_core::op::Activation) -> Result<()> {
        self.packed.gate(act)
    }

    /// Repacks `w`; fails when it is not Q4_K or when its row count is not
    /// a multiple of eight.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ4K> {
        Self::pack_with(std::slice::from_ref(w), None, &|_| {})
    }

    /// [`PackedKQuant::pack_with`] for Q4_K.
    pub(crate) fn pack_with(
        parts: &[QuantMatrix<'_>],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<PackedQ4K> {
        PackedKQuant::pack_with(parts, arena, copied).map(|packed| PackedQ4K { packed })
    }
}

impl<B: SubBlockBits> PackedKQuant<B> {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: mllm_core::op::Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not of `B`'s block type or when its
    /// row count is not a multiple of eight.
    #[cfg(test)]
    pub(crate) fn pack(w: &QuantMatrix<'_>) -> Result<PackedKQuant<B>> {
        Self::pack_with(std::slice::from_ref(w), None, &|_| {})
    }

    /// Repacks `parts`, matrices of `B`'s block type and one width stacked
    /// into one (see `packed::SourceRows`; fails as `pack` does for one
    /// matrix), into a buffer from `arena` (a buffer of its own without
    /// one), calling `copied` with each range of stacked rows once it is
    /// packed (see `packed::pack_blocks`).
    pub(crate) fn pack_with(
        parts: &[QuantMatrix<'_>],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<PackedKQuant<B>> {
        let w = SourceRows::new(parts, &[B::QT], &B::QT.to_string())?;
        let (rows, cols) = (w.rows(), w.cols());
        let (supers, block_bytes) = (cols / B::QT.block_len(), B::QT.block_bytes());
        let mut data = WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * supers * B::SUPER_BYTES)?;
        pack_blocks(&mut data, B::SUPER_BYTES, supers, copied, |g, s, out| {
            for r in 0..GROUP_ROWS {
                let row = w.row(g * GROUP_ROWS + r);
                let b = &row[s * block_bytes..(s + 1) * block_bytes];
                pack_header(b, r, out);
                B::pack_bits(b, r, &mut out[BITS_AT..]);
            }
            Ok(())
        })?;
        Ok(PackedKQuant {
            data: PackedData::owned(data, rows, cols, B::SUPER_BYTES / SUB_BLOCKS),
            bits: PhantomData,
        })
    }

    /// Row `r`'s values from the packed bytes of its group (`d·sc·q −
    /// dmin·m`, the values the block type dequantizes to).
    #[cfg(test)]
    pub(crate) fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (sb, out) in group
            .chunks_exact(B::SUPER_BYTES)
            .zip(out.chunks_exact_mut(B::QT.block_len()))
        {
            for (j, out) in out.chunks_exact_mut(BLOCK).enumerate() {
                let bits = &sb[BITS_AT + B::BLOCK_BITS * j..][..B::BLOCK_BITS];
                let (d, m) = sub_block_scales(sb, r, j);
                for (col, o) in out.iter_mut().enumerate() {
                    *o = d * B::value(bits, r, col) as f32 + m;
                }
            }
        }
    }
}

/// Writes the header of a Q4_K or Q5_K super-block `b` (f16 `d` and
/// `dmin`, then 12 bytes of 6-bit scales and minimums) as row `r` of a
/// packed group super-block `out`, the scales and minimums unpacked.
fn pack_header(b: &[u8], r: usize, out: &mut [u8]) {
    out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
    out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[2..4]);
    let (sc, m) = q4_k::unpack_scales(&b[4..16]);
    for j in 0..SUB_BLOCKS {
        out[SCALES_AT + GROUP_ROWS * j + r] = sc[j];
        out[MINS_AT + GROUP_ROWS * j + r] = m[j];
    }
}

/// Row `r`'s `d` and `dmin` in a packed group super-block.
fn super_scales(sb: &[u8], r: usize) -> (f32, f32) {
    let f = |at: usize| f16::from_le_bytes([sb[at], sb[at + 1]]).to_f32();
    (f(2 * r), f(16 + 2 * r))
}

/// Row `r`'s scale `d·sc` and offset `−dmin·m` in sub-block `j` of a packed
/// group super-block.
#[cfg(test)]
fn sub_block_scales(sb: &[u8], r: usize, j: usize) -> (f32, f32) {
    let (d, dmin) = super_scales(sb, r);
    let sc = sb[SCALES_AT + GROUP_ROWS * j + r] as f32;
    let m = sb[MINS_AT + GROUP_ROWS * j + r] as f32;
    (d * sc, -dmin * m)
}

/// Q4_K's sub-block bits: 128 bytes of nibbles in the packed Q4 layout.
pub(crate) struct Nibbles;

impl SubBlockBits for Nibbles {
    const QT: QuantType = QuantType::Q4K;
    const BLOCK_BITS: usize = GROUP_ROWS * BLOCK / 2;

    fn pack_bits(b: &[u8], r: usize, bits: &mut [u8]) {
        let qs = &b[16..q4_k::BLOCK_BYTES];
        for j in 0..SUB_BLOCKS {
            let (bytes, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
            let value = |l: usize| (bytes[l] >> shift) & 15;
            let nibbles = &mut bits[Self::BLOCK_BITS * j..][..Self::BLOCK_BITS];
            for i in 0..16 {
                nibbles[32 * (i / 4) + 4 * r + i % 4] = value(i) | (value(16 + i) << 4);
            }
        }
    }

    #[cfg(test)]
    fn value(bits: &[u8], r: usize, col: usize) -> u8 {
        let k = col % 16;
        (bits[32 * (k / 4) + 4 * r + k % 4] >> (4 * (col / 16))) & 15
    }

    fn block_sum<const SHIFT: u32>(bits: &[u8], r: usize, hi: &[i8], lo: &[i8]) -> i32 {
        nibble_block_sum::<SHIFT>(bits, r, hi, lo)
    }

    super::packed::simd_group_products!(
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>,
        avx2_packed_q4k,
        avx_vnni_packed::q4k,
        vnni_packed_q4k
    );

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs<const SHIFT: u32>(
        tiles: &FullTiles,
        groups: &[u8],
        group_bytes: usize,
        rows: &RowTiles<'_, '_, SHIFT>,
        out: (&mut [[f32; GROUP_ROWS]], usize),
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { super::simd::amx_kquant::q4k::pairs(tiles, groups, group_bytes, rows, out) }
    }
}

/// Bytes of activation planes per call of the AMX kernel: all 128 rows
/// of a row block up to 4096 columns of 16-bit rows (8192 of 8-bit ones);
/// half as many for the 16-bit rows of a 1B model's down projection
/// (8192 wide).
#[cfg(target_arch = "x86_64")]
const AMX_ROW_BYTES: usize = 2 << 20;

/// Activation rows per call of an AMX K-quant kernel for rows of `cols`
/// values split at `SHIFT`: as many tiles as keep their planes within
/// [`AMX_ROW_BYTES`], at most `amx_kquant::MAX_TILES`. The kernels fold
/// the scales into each super-block of weights once for all of a call's
/// rows.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_rows_for<const SHIFT: u32>(cols: usize) -> usize {
    let planes = if SHIFT == BYTE { 1 } else { 2 };
    let tiles = AMX_ROW_BYTES / (TILE_ROWS * cols * planes).max(1);
    tiles.clamp(1, MAX_TILES) * TILE_ROWS
}

/// The packed layout of sub-block bits `B` as a [`PackedFormat`] for
/// activation rows split at `SHIFT` ([`WIDE`] or [`BYTE`]).
pub(crate) struct KQuantFormat<B, const SHIFT: u32>(PhantomData<B>);

impl<B: SubBlockBits, const SHIFT: u32> PackedFormat for KQuantFormat<B, SHIFT> {
    type Input<'a> = Q16Row<'a, SHIFT>;
    const BLOCK_BYTES: usize = B::SUPER_BYTES / SUB_BLOCKS;
    const PER_SCALE: usize = SUPER_BLOCK;
    /// Eight 8-bit rows per AVX-512 pair call, which spread each
    /// sub-block's nibble unpacking over twice the rows (the 1.1B
    /// Q4_K_M's and Q5_K_M's 8-bit prefill at that level rose 4 % and
    /// 10 %); 16-bit rows, whose sums take twice the registers, keep four.
    const PAIR_TILE_TOKENS: usize = if SHIFT == BYTE {
        WIDE_TILE_TOKENS
    } else {
        TILE_TOKENS
    };

    fn blocks(x: &Q16Row<'_, SHIFT>) -> usize {
        x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q16Row<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot::<B, SHIFT>(group, xs, out)
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { B::avx2(group, xs, out, reads) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx_vnni(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { B::avx_vnni(group, xs, out, reads) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni(
        group: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { B::vnni(group, xs, out, reads) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { B::vnni_pair(a, b, xs, out, reads) }
    }

    const AMX: bool = true;

    /// See [`amx_rows_for`].
    #[cfg(target_arch = "x86_64")]
    fn amx_rows(cols: usize) -> usize {
        amx_rows_for::<SHIFT>(cols)
    }

    /// See `amx_kquant::full_tiles_then_rest`.
    ///
    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs(
        groups: &[u8],
        group_bytes: usize,
        xs: &[Q16Row<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
    ) -> bool {
        let groups = (groups, group_bytes);
        // SAFETY: the caller guarantees the features, AMX among them
        // (trait contract).
        unsafe { full_tiles_then_rest::<Self, SHIFT>(groups, (xs, xs), out, B::amx_pairs::<SHIFT>) }
    }
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to `TILE_TOKENS` rows, one scale `d_x` per super-block), in
/// portable code: per super-block and row the integers `Σ_j sc_j·Σ q·hi`,
/// `Σ_j sc_j·Σ q·lo` and `Σ_j m_j·Σ q_x`, then the float step of the SIMD
/// kernels (see the module documentation).
fn group_dot<B: SubBlockBits, const SHIFT: u32>(
    group: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    const ZEROS: [i8; BLOCK] = [0; BLOCK];
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        *out = [0.0; GROUP_ROWS];
        for (s, sb) in group.chunks_exact(B::SUPER_BYTES).enumerate() {
            let first = s * SUB_BLOCKS;
            for (r, acc) in out.iter_mut().enumerate() {
                let (mut hi_sum, mut lo_sum, mut mins) = (0i32, 0i32, 0i32);
                for j in 0..SUB_BLOCKS {
                    let i = first + j;
                    let bits = &sb[BITS_AT + B::BLOCK_BITS * j..][..B::BLOCK_BITS];
                    let (hi, lo) = (&x.hi[i * BLOCK..][..BLOCK], &x.lo[i * BLOCK..][..BLOCK]);
                    let sc = sb[SCALES_AT + GROUP_ROWS * j + r] as i32;
                    hi_sum += sc * B::block_sum::<BYTE>(bits, r, hi, &ZEROS);
                    lo_sum += sc * B::block_sum::<BYTE>(bits, r, lo, &ZEROS);
                    mins += sb[MINS_AT + GROUP_ROWS * j + r] as i32 * x.sums[i];
                }
                let (d, dmin) = super_scales(sb, r);
                let dx = x.d[first];
                let sum = if SHIFT == BYTE {
                    hi_sum as f32
                } else {
                    (hi_sum as f32).mul_add((1u32 << SHIFT) as f32, lo_sum as f32)
                };
                *acc = sum.mul_add(d * dx, *acc);
                *acc = (mins as f32).mul_add(-dmin * dx, *acc);
            }
        }
    }
}

/// Linear layer over a packed K-quant matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` with the activation rows quantized to 16 bits (two
/// 8-bit planes per block of 32 split at [`WIDE`]), or to 8 bits
/// ([`BYTE`]) on [`QuantPath::Int8Packed`]. `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`; parallel over row groups in
/// `pool` unless the work is tiny. Each row's result is independent of the
/// other rows and of the split over threads. Slice lengths are checked
/// with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn packed_kquant_linear<B: SubBlockBits>(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedKQuant<B>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    let w = &w.data;
    if k.path() == QuantPath::Int8Packed {
        wide_packed_linear::<KQuantFormat<B, BYTE>, BYTE>(k, x, rows, w, bias, y, pool, scratch)
    } else {
        wide_packed_linear::<KQuantFormat<B, WIDE>, WIDE>(k, x, rows, w, bias, y, pool, scratch)
    }
}

/// Linear layer over a packed Q4_K matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` with the activation rows quantized to 16 bits, or to
/// 8 bits on [`QuantPath::Int8Packed`]. `x` is `[rows, cols]`, `y`
/// `[rows, out]`; parallel over row groups in `pool` unless the work is
/// tiny, each row's result independent of the other rows and of the split
/// over threads. Slice lengths are checked with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_q4k_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ4K,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    packed_kquant_linear(k, x, rows, &w.packed, bias, y, pool, scratch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_group_products, check_packed_linear_per, check_rows_alone, check_unpacked_rows,
        extreme_acts, BoundLinear, PATHS, SCALAR_AND_X86_LEVELS,
    };
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::kernels::packed::tests::{check_tile_products, check_tiles_take_rows};
    use crate::cpu::kernels::packed_q5k::FiveBits;
    use crate::cpu::kernels::qact::Q16Act;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::qkernel::SimdLevel;
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::kernels::simd::amx::TILE_ROWS;
    use crate::cpu::kernels::test_util::Rng;

    /// Random blocks of `B`'s type for `rows` rows of `supers`
    /// super-blocks, and their packed matrix.
    fn random_packed<B: SubBlockBits>(
        rng: &mut Rng,
        rows: usize,
        supers: usize,
    ) -> (Vec<u8>, PackedKQuant<B>) {
        let cols = supers * B::QT.block_len();
        let w = random_blocks(rng, B::QT, rows * supers);
        let p = PackedKQuant::<B>::pack(&QuantMatrix::new(B::QT, &w, rows, cols).unwrap()).unwrap();
        (w, p)
    }

    /// Each row unpacked from the packed layout has exactly the values the
    /// block type's dequantizer gives the unpacked row.
    fn check_unpacked<B: SubBlockBits>(rng: &mut Rng) {
        let (rows, supers) = (16, 3);
        let cols = supers * B::QT.block_len();
        let (w, p) = random_packed::<B>(rng, rows, supers);
        let groups = |g| p.data.groups(g, 1);
        check_unpacked_rows(
            B::QT,
            &w,
            [rows, cols],
            &groups,
            PackedKQuant::<B>::unpack_row,
        );
    }

    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(51);
        check_unpacked::<Nibbles>(&mut rng);
        check_unpacked::<FiveBits>(&mut rng);
    }

    /// The layer matches the f64 product of the dequantized weights at
    /// every level and thread count on both paths (see
    /// `check_packed_linear`), for one row (decode) and row counts that do
    /// and do not fill the token tile.
    fn check_linear<B: SubBlockBits>(rng: &mut Rng) {
        let cases = [
            (1, 8, 8),
            (1, 16, 72),
            (5, 24, 16),
            (70, 8, 24),
            (131, 8, 8),
        ];
        let blocks = |rng: &mut Rng, n: usize| random_blocks(rng, B::QT, n / SUB_BLOCKS);
        for path in PATHS {
            check_packed_linear_per(
                path,
                rng,
                (B::QT, SUPER_BLOCK),
                &blocks,
                &cases,
                &|k, m, x, rows, b, y, pool| {
                    let p = PackedKQuant::<B>::pack(m).unwrap();
                    packed_kquant_linear(k, x, rows, &p, b, y, pool, &ActivationScratch::default())
                },
            );
        }
    }

    #[test]
    fn packed_linear_matches_reference() {
        let mut rng = Rng::new(52);
        check_linear::<Nibbles>(&mut rng);
        check_linear::<FiveBits>(&mut rng);
    }

    /// Batch invariance on both paths (see `check_rows_alone`).
    fn check_alone<B: SubBlockBits>(rng: &mut Rng) {
        let cases = [(3, 1, 64), (6, 2, 40), (45, 2, 32), (131, 1, 24)];
        for (path, &(rows, supers, out_f)) in PATHS
            .iter()
            .flat_map(|p| cases.iter().map(move |c| (*p, c)))
        {
            let in_f = supers * B::QT.block_len();
            let w = random_blocks(rng, B::QT, out_f * supers);
            let m = QuantMatrix::new(B::QT, &w, out_f, in_f).unwrap();
            let p = PackedKQuant::<B>::pack(&m).unwrap();
            let x = rng.vec(rows * in_f, 1.0);
            let b = rng.vec(out_f, 1.0);
            let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
                packed_kquant_linear(
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
            check_rows_alone(path, linear, &x, rows, out_f, false, &B::QT.to_string());
        }
    }

    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(53);
        check_alone::<Nibbles>(&mut rng);
        check_alone::<FiveBits>(&mut rng);
    }

    /// The AVX-VNNI and AVX-512 VNNI group products of rows split at
    /// `SHIFT` equal the AVX2 ones bit for bit, for one group (256-bit) and
    /// two (512-bit) and one row to the AVX-512 pair kernel's tile (eight
    /// 8-bit rows, four 16-bit ones).
    fn check_levels<B: SubBlockBits, const SHIFT: u32>(rng: &mut Rng) {
        let (rows, supers) = (2 * GROUP_ROWS, 2);
        let cols = supers * B::QT.block_len();
        let (_, p) = random_packed::<B>(rng, rows, supers);
        let acts: Vec<Q16Act<SHIFT>> = (0..KQuantFormat::<B, SHIFT>::PAIR_TILE_TOKENS)
            .map(|_| Q16Act::quantize_per(&rng.vec(cols, 3.0), SUPER_BLOCK))
            .collect();
        let xs: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
        let what = format!("{} split at {SHIFT}", B::QT);
        let groups = p.data.groups(0, 2);
        check_group_products::<KQuantFormat<B, SHIFT>>(groups, &xs, &levels, &what);
    }

    /// Weights of `B`'s type at their extremes (every value the largest,
    /// 15 or 31, or every value 0; all scales and minimums 63) against
    /// rows `values` (each value in every column, with the split's largest
    /// magnitude once per super-block, so that each becomes that integer):
    /// every level gives the scalar code's bits, and the AMX tiles of 16
    /// such rows the AVX-512 bits. With 16-bit rows whose planes sit at
    /// their extremes (`lo = −128` with `hi = −126`, and `hi = lo = 127`)
    /// and 8-bit rows of `±127`, the AVX-512 Q4_K pair kernel's sums of 16
    /// columns reach `16·15·128`, near `i16`'s bound, which its scale step
    /// (`vpdpwssd`) relies on.
    fn check_extreme_levels<B: SubBlockBits, const SHIFT: u32>(values: &[f32]) {
        let (rows, supers) = (2 * GROUP_ROWS, 2);
        let cols = supers * SUPER_BLOCK;
        let block_bytes = B::QT.block_bytes();
        let mut w = vec![0u8; rows * supers * block_bytes];
        for (i, b) in w.chunks_exact_mut(block_bytes).enumerate() {
            let d = half::f16::from_f32(0.01).to_le_bytes();
            b[..4].copy_from_slice(&[d[0], d[1], d[0], d[1]]);
            b[4..16].copy_from_slice(&q4_k::pack_scales(&[63; 8], &[63; 8]));
            b[16..].fill(if i % 3 == 2 { 0x00 } else { 0xFF });
        }
        let m = QuantMatrix::new(B::QT, &w, rows, cols).unwrap();
        let p = PackedKQuant::<B>::pack(&m).unwrap();
        let acts = extreme_acts::<SHIFT>(values, cols, SUPER_BLOCK);
        let xs: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let levels = SCALAR_AND_X86_LEVELS;
        let what = format!("extreme {} split at {SHIFT}", B::QT);
        let groups = p.data.groups(0, 2);
        check_group_products::<KQuantFormat<B, SHIFT>>(groups, &xs, &levels, &what);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::kernels::packed::tests::{extreme_tile, tile_rows};
            let act = extreme_tile::<SHIFT>(values, cols, SUPER_BLOCK);
            check_tile_products::<KQuantFormat<B, SHIFT>>(groups, &tile_rows(&act, cols), &what);
        }
    }

    #[test]
    fn extreme_sums_agree_at_every_level() {
        // `-32384 = 256·(-126) - 128`, and the wide split's largest value.
        let wide = [-32384.0, 32639.0, -32639.0];
        check_extreme_levels::<Nibbles, WIDE>(&wide);
        check_extreme_levels::<FiveBits, WIDE>(&wide);
        check_extreme_levels::<Nibbles, BYTE>(&[-127.0, 127.0]);
        check_extreme_levels::<FiveBits, BYTE>(&[-127.0, 127.0]);
    }

    /// One row's span of packed K-quant groups at the AVX2 level (pair by
    /// pair: the K-quants have no row run) gives each group its own bits
    /// (see `packed::tests::check_row_runs`).
    #[cfg(target_arch = "x86_64")]
    fn check_one_row_spans<B: SubBlockBits, const SHIFT: u32>(rng: &mut Rng) {
        use crate::cpu::kernels::packed::tests::check_row_runs;
        let (groups_n, supers) = (5, 2);
        let (rows, cols) = (groups_n * GROUP_ROWS, supers * B::QT.block_len());
        let (_, p) = random_packed::<B>(rng, rows, supers);
        let act = Q16Act::<SHIFT>::quantize_per(&rng.vec(cols, 3.0), SUPER_BLOCK);
        let what = format!("{} split at {SHIFT}", B::QT);
        let groups = (p.data.groups(0, groups_n), groups_n);
        check_row_runs::<KQuantFormat<B, SHIFT>>(groups, act.row(), &what);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_one_row_span_gives_each_group_its_own_bits() {
        let mut rng = Rng::new(58);
        check_one_row_spans::<Nibbles, WIDE>(&mut rng);
        check_one_row_spans::<FiveBits, BYTE>(&mut rng);
    }

    #[test]
    fn vnni_group_dot_equals_avx2() {
        let mut rng = Rng::new(54);
        check_levels::<Nibbles, WIDE>(&mut rng);
        check_levels::<FiveBits, WIDE>(&mut rng);
        check_levels::<Nibbles, BYTE>(&mut rng);
        check_levels::<FiveBits, BYTE>(&mut rng);
    }

    /// The AMX tile products of 16 rows split at `SHIFT` (see
    /// `check_tile_products`), and the tile kernel's many tiles of rows at
    /// once and the rows after the last whole tile (one, two and eight
    /// tiles, with and without rows after them; 13 rows after one tile
    /// take the AVX-512 pair kernel twice with 8-bit rows; see
    /// `check_tiles_take_rows`).
    #[cfg(target_arch = "x86_64")]
    fn check_tiles<B: SubBlockBits, const SHIFT: u32>(rng: &mut Rng) {
        let (groups_n, supers) = (4, 3);
        let (rows, cols) = (groups_n * GROUP_ROWS, supers * B::QT.block_len());
        let (_, p) = random_packed::<B>(rng, rows, supers);
        let what = format!("{} split at {SHIFT}", B::QT);
        for n in [TILE_ROWS, 21, 29, 48, 8 * TILE_ROWS] {
            let act = Q16Act::<SHIFT>::quantize_per(&rng.vec(n * cols, 3.0), SUPER_BLOCK);
            let xs: Vec<Q16Row<'_, SHIFT>> = (0..n).map(|t| act.row().sub_row(t, cols)).collect();
            if n == TILE_ROWS {
                check_tile_products::<KQuantFormat<B, SHIFT>>(p.data.groups(0, 2), &xs, &what);
            }
            let groups = (p.data.groups(0, groups_n), groups_n);
            check_tiles_take_rows::<KQuantFormat<B, SHIFT>>(groups, &xs, &what);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tile_products_equal_avx512() {
        let mut rng = Rng::new(55);
        check_tiles::<Nibbles, WIDE>(&mut rng);
        check_tiles::<FiveBits, WIDE>(&mut rng);
        check_tiles::<Nibbles, BYTE>(&mut rng);
        check_tiles::<FiveBits, BYTE>(&mut rng);
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * q4_k::BLOCK_BYTES];
        let m = QuantMatrix::new(QuantType::Q4K, &w, 7, q4_k::BLOCK_LEN).unwrap();
        let err = PackedQ4K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 18];
        let m = QuantMatrix::new(QuantType::Q4_0, &w, 8, 32).unwrap();
        let err = PackedQ4K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("as q4_k, not q4_0"), "{err}");
        let w = vec![0u8; 8 * q4_k::BLOCK_BYTES];
        let m = QuantMatrix::new(QuantType::Q4K, &w, 8, q4_k::BLOCK_LEN).unwrap();
        let err = PackedKQuant::<FiveBits>::pack(&m).err().unwrap();
        assert!(err.to_string().contains("as q5_k, not q4_k"), "{err}");
    }
}
