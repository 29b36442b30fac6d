//! Q6_K weights repacked at load for the integer kernels (16-bit
//! activations, or 8-bit ones on `QuantPath::Int8Packed`), and the linear
//! layer over them.
//!
//! Rows come in groups of eight. Per group and super-block of 256 columns
//! (1680 bytes, the size of eight Q6_K super-blocks):
//!
//! ```text
//! [d: 8 × f16][sc: 16 sub-blocks × 8 rows × i8]
//! [8 blocks of 32 columns × (128 bytes of low nibbles, 64 bytes of top bits)]
//! ```
//!
//! A block's low nibbles take the packed Q4 layout (see `packed`): four
//! 32-byte chunks, chunk `c` holding for each row `r` (bytes `4r..4r + 4`)
//! the low four bits of the values at columns `4c..4c + 4` (low nibbles)
//! and `16 + 4c..16 + 4c + 4` (high nibbles). The top two bits follow in
//! two 32-byte words: byte `4r + k` of word `c / 2` holds, from bit
//! `4·(c mod 2)` on, those of column `4c + k` and then of `16 + 4c + k`.
//! So one 256-bit load of each rebuilds the 6-bit values `q` of four
//! columns of all eight rows with shifts and masks.
//!
//! The two halves of a block are Q6_K's sub-blocks of 16, each with its own
//! 8-bit scale. The activation rows have one scale `d_x` per super-block
//! (`qact::SUPER_BLOCK`), so the halves add up as integers: with the
//! 16-bit values `q_x = 2^SHIFT·hi + lo` of a row split at `SHIFT`, row
//! `r` gets per super-block
//!
//! ```text
//! H = Σ_h sc_h·Σ (q − 32)·hi    L = Σ_h sc_h·Σ (q − 32)·lo
//! acc = fma(2^SHIFT·H + L, d·d_x, acc)
//! ```
//!
//! (`2^SHIFT·H + L` one `fma` in f32, `L = 0` for 8-bit rows). The
//! vector kernels start each half's sums `Σ q·hi` and `Σ q·lo` at the
//! row's offsets `−32·Σ hi` and `−32·Σ lo` (computed once per call); the
//! AMX kernel (`amx_q6k`) folds `sc·(q − 32)` into the weights. Each
//! integer is exact in 32 bits (`|H|, |L| < 2^28`), and every level takes
//! the same float steps, so all levels give the same bits.

use std::ops::Range;

use half::f16;
use mllm_core::Result;
use rayon::ThreadPool;

use super::packed::{
    by_row_blocks, fill_by_rows, pack_blocks, packed_group_outputs, quantize_rows, PackedData,
    PackedFormat, SourceRows, GROUP_ROWS, TILE_TOKENS, WIDE_TILE_TOKENS,
};
use super::qact::{ActivationScratch, Q16Row, BLOCK, BYTE, SUPER_BLOCK, WIDE};
use super::qkernel::{QuantKernel, QuantPath};
use super::qmatmul::{QuantMatrix, Split};
#[cfg(target_arch = "x86_64")]
use super::simd::amx_kquant::{full_tiles_then_rest, TileKernel};
use super::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q6_k, QuantType};

/// Blocks of 32 columns per super-block.
pub(crate) const BLOCKS: usize = q6_k::BLOCK_LEN / BLOCK;
/// Offset of the eight rows' 8-bit scales, sub-block of 16 after sub-block.
pub(crate) const SCALES_AT: usize = 2 * GROUP_ROWS;
/// Offset of the first block's bits.
pub(crate) const BITS_AT: usize = SCALES_AT + 2 * BLOCKS * GROUP_ROWS;
/// Bytes of low nibbles per group and block.
pub(crate) const NIBBLE_BYTES: usize = GROUP_ROWS * BLOCK / 2;
/// Bytes of bits (nibbles, then top bits) per group and block.
pub(crate) const BLOCK_BITS: usize = NIBBLE_BYTES + GROUP_ROWS * BLOCK / 4;
/// Bytes of one group per super-block.
pub(crate) const SUPER_BYTES: usize = BITS_AT + BLOCKS * BLOCK_BITS;

/// A Q6_K matrix `[rows, cols]` repacked in groups of eight rows (see the
/// module documentation).
pub struct PackedQ6K {
    data: PackedData,
}

impl PackedQ6K {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: mllm_core::op::Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not Q6_K or when its row count is not
    /// a multiple of eight.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ6K> {
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
    ) -> Result<PackedQ6K> {
        let w = SourceRows::new(parts, &[QuantType::Q6K], "q6_k")?;
        let (rows, cols) = (w.rows(), w.cols());
        let supers = cols / q6_k::BLOCK_LEN;
        let mut data = WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * supers * SUPER_BYTES)?;
        pack_blocks(&mut data, SUPER_BYTES, supers, copied, |g, s, out| {
            for r in 0..GROUP_ROWS {
                let row = w.row(g * GROUP_ROWS + r);
                let b = row[s * q6_k::BLOCK_BYTES..(s + 1) * q6_k::BLOCK_BYTES]
                    .try_into()
                    .expect("one super-block");
                pack_row(b, r, out);
            }
            Ok(())
        })?;
        Ok(PackedQ6K {
            data: PackedData::owned(data, rows, cols, SUPER_BYTES / BLOCKS),
        })
    }

    /// Row `r`'s values from the packed bytes of its group (`d·sc·(q −
    /// 32)`, the values Q6_K dequantizes to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (sb, out) in group
            .chunks_exact(SUPER_BYTES)
            .zip(out.chunks_exact_mut(q6_k::BLOCK_LEN))
        {
            for (i, o) in out.iter_mut().enumerate() {
                let q = value(sb, r, i) as i32 - 32;
                *o = half_scale(sb, r, i / 16) * q as f32;
            }
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
}

/// Where the bits of column `col` (`0..32`) of row `r` live in a block's
/// bits: the nibble byte and its shift, the top-bits byte and its shift.
fn bit_places(r: usize, col: usize) -> (usize, u32, usize, u32) {
    let (half, k) = (col / 16, col % 16);
    let (c, lane) = (k / 4, 4 * r + k % 4);
    let nibble = (32 * c + lane, 4 * half as u32);
    let top = (
        NIBBLE_BYTES + 32 * (c / 2) + lane,
        4 * (c % 2) as u32 + 2 * half as u32,
    );
    (nibble.0, nibble.1, top.0, top.1)
}

/// Writes super-block `b` (210 bytes of Q6_K) as row `r` of a packed group
/// super-block `out`.
fn pack_row(b: &[u8; q6_k::BLOCK_BYTES], r: usize, out: &mut [u8]) {
    out[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
    for j in 0..2 * BLOCKS {
        out[SCALES_AT + GROUP_ROWS * j + r] = b[192 + j];
    }
    let values = q6_k::values(b);
    let blocks = values.as_chunks::<BLOCK>().0;
    let out = out[BITS_AT..BITS_AT + BLOCKS * BLOCK_BITS]
        .as_chunks_mut::<BLOCK_BITS>()
        .0;
    for (q, bits) in blocks.iter().zip(out) {
        pack_block_bits(q, r, bits);
    }
}

/// Writes row `r`'s 32 values `q` of one block into the block's bits, as
/// [`bit_places`] says: per column pair `(4c + k, 16 + 4c + k)` one byte of
/// nibbles, and per two chunks `c` one byte of top bits. Every byte is
/// stored, never read: a first read of a fresh page of the output would
/// map the shared zero page, and the store after it would have to copy it
/// and flush the other threads' TLBs.
fn pack_block_bits(q: &[u8; BLOCK], r: usize, bits: &mut [u8; BLOCK_BITS]) {
    let top = |c: usize, k: usize| (q[4 * c + k] >> 4) | ((q[16 + 4 * c + k] >> 4) << 2);
    for k in 0..4 {
        let lane = 4 * r + k;
        for c in 0..4 {
            bits[32 * c + lane] = (q[4 * c + k] & 15) | ((q[16 + 4 * c + k] & 15) << 4);
        }
        for word in 0..2 {
            bits[NIBBLE_BYTES + 32 * word + lane] = top(2 * word, k) | (top(2 * word + 1, k) << 4);
        }
    }
}

/// The 6-bit value at column `i` (`0..256`) of row `r` in a packed group
/// super-block.
fn value(sb: &[u8], r: usize, i: usize) -> u8 {
    let bits = &sb[BITS_AT + BLOCK_BITS * (i / BLOCK)..][..BLOCK_BITS];
    let (nib, nib_shift, top, top_shift) = bit_places(r, i % BLOCK);
    ((bits[nib] >> nib_shift) & 15) | (((bits[top] >> top_shift) & 3) << 4)
}

/// Row `r`'s multiplier `d·sc` of sub-block `j` (16 columns) of a packed
/// group super-block.
fn half_scale(sb: &[u8], r: usize, j: usize) -> f32 {
    let d = f16::from_le_bytes([sb[2 * r], sb[2 * r + 1]]).to_f32();
    d * (sb[SCALES_AT + GROUP_ROWS * j + r] as i8) as f32
}

/// One activation row as the packed Q6_K kernels take it: its planes
/// (split at `SHIFT`, [`WIDE`] or [`BYTE`], one scale per super-block)
/// and each half block's offsets `−32·Σ hi` and `−32·Σ lo` (16 values),
/// which turn `Σ q·x` into `Σ (q − 32)·x` plane by plane.
#[derive(Clone, Copy)]
pub(crate) struct Q6KInput<'a, const SHIFT: u32> {
    /// The quantized row.
    pub x: Q16Row<'a, SHIFT>,
    /// `[−32·Σ hi, −32·Σ lo]` over each 16 values. Stored ready to add,
    /// so that a kernel can start a half's sums at them (broadcasts from
    /// memory) instead of scaling and subtracting per weight group.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub half_offsets: &'a [[i32; 2]],
}

/// The half offsets of `T` rows (see [`Q6KInput::half_offsets`]) block by
/// block, every row cut to the same `nb` blocks once, so that a tile reads
/// block `i` of all rows after one bounds check (as `RowPlanes` does).
#[cfg(target_arch = "x86_64")]
pub(crate) struct RowHalfOffsets<'a, const T: usize> {
    rows: [&'a [[[i32; 2]; 2]]; T],
    nb: usize,
}

/// Where [`RowHalfOffsets::block`] starts its rows' offsets.
#[cfg(target_arch = "x86_64")]
static NO_OFFSETS: [[i32; 2]; 2] = [[0; 2]; 2];

#[cfg(target_arch = "x86_64")]
impl<'a, const T: usize> RowHalfOffsets<'a, T> {
    /// The first `nb` blocks' offsets of the rows `xs`.
    ///
    /// # Panics
    ///
    /// If a row has offsets for fewer than `nb` blocks.
    #[inline]
    pub(crate) fn new<const SHIFT: u32>(xs: &[Q6KInput<'a, SHIFT>; T], nb: usize) -> Self {
        RowHalfOffsets {
            rows: xs.map(|x| &x.half_offsets.as_chunks::<2>().0[..nb]),
            nb,
        }
    }

    /// Block `i`'s two halves' offsets of every row.
    ///
    /// # Panics
    ///
    /// If `i` is not below the `nb` the offsets were made with.
    #[inline]
    pub(crate) fn block(&self, i: usize) -> [&'a [[i32; 2]; 2]; T] {
        assert!(i < self.nb, "a block past the offsets");
        let mut out = [&NO_OFFSETS; T];
        for (o, row) in out.iter_mut().zip(self.rows) {
            // SAFETY: every row holds `nb` blocks' offsets (cut in `new`)
            // and `i < nb` (asserted above).
            *o = unsafe { row.get_unchecked(i) };
        }
        out
    }
}

/// `[−32·Σ hi, −32·Σ lo]` of each 16 values of the planes `hi` and `lo`,
/// into `out`.
fn half_offsets_into(hi: &[i8], lo: &[i8], out: &mut [[i32; 2]]) {
    let sum = |p: &[i8]| p.iter().map(|&v| v as i32).sum::<i32>();
    for (o, (h, l)) in out
        .iter_mut()
        .zip(hi.chunks_exact(16).zip(lo.chunks_exact(16)))
    {
        *o = [-32 * sum(h), -32 * sum(l)];
    }
}

/// [`half_offsets_into`] of every row of `xs` (`in_f` values each), row
/// after row, in the pool when the call is parallel.
fn half_offsets<const SHIFT: u32>(
    xs: &[Q16Row<'_, SHIFT>],
    in_f: usize,
    split: &Split<'_>,
) -> Vec<[i32; 2]> {
    let per_row = in_f / 16;
    let mut offsets = vec![[0; 2]; xs.len() * per_row];
    fill_by_rows(split, in_f, xs, per_row, &mut offsets, |x, out| {
        half_offsets_into(x.hi, x.lo, out)
    });
    offsets
}

/// The packed Q6_K layout (see the module documentation) for activation
/// rows split at `SHIFT`.
pub(crate) struct Q6KFormat<const SHIFT: u32>;

impl<const SHIFT: u32> PackedFormat for Q6KFormat<SHIFT> {
    type Input<'a> = Q6KInput<'a, SHIFT>;
    const BLOCK_BYTES: usize = SUPER_BYTES / BLOCKS;
    const PER_SCALE: usize = SUPER_BLOCK;
    /// Eight 8-bit rows per AVX-512 pair call, which spread each block's
    /// unpacking of the 6-bit values over twice the rows; 16-bit rows,
    /// whose sums take twice the registers, keep four.
    const PAIR_TILE_TOKENS: usize = if SHIFT == BYTE {
        WIDE_TILE_TOKENS
    } else {
        TILE_TOKENS
    };

    fn blocks(x: &Q6KInput<'_, SHIFT>) -> usize {
        x.x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q6KInput<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    super::packed::simd_group_products!(
        [],
        Q6KInput<'_, SHIFT>,
        avx2_packed_q6k,
        avx_vnni_packed::q6k,
        vnni_packed_q6k
    );

    const AMX: bool = true;

    /// As many tiles as keep the planes of a call's rows within
    /// `packed_q4k::AMX_ROW_BYTES` (see there).
    #[cfg(target_arch = "x86_64")]
    fn amx_rows(cols: usize) -> usize {
        super::packed_q4k::amx_rows_for::<SHIFT>(cols)
    }

    /// `amx_kquant::full_tiles_then_rest` with `simd::amx_q6k`'s kernel.
    ///
    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs(
        groups: &[u8],
        group_bytes: usize,
        xs: &[Q6KInput<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
    ) -> bool {
        let rows: Vec<Q16Row<'_, SHIFT>> = xs.iter().map(|x| x.x).collect();
        let kernel: TileKernel<SHIFT> = super::simd::amx_q6k::pairs::<SHIFT>;
        // SAFETY: the caller guarantees the features, AMX among them
        // (trait contract).
        unsafe {
            full_tiles_then_rest::<Self, SHIFT>((groups, group_bytes), (xs, &rows), out, kernel)
        }
    }
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to `TILE_TOKENS` rows), in portable code: per super-block and row
/// the integers `H` and `L` and the float step of the module
/// documentation.
pub(crate) fn group_dot<const SHIFT: u32>(
    group: &[u8],
    xs: &[Q6KInput<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (input, out) in xs.iter().zip(out.iter_mut()) {
        let x = input.x;
        *out = [0.0; GROUP_ROWS];
        for (s, sb) in group.chunks_exact(SUPER_BYTES).enumerate() {
            let dx = x.d[s * BLOCKS];
            for (r, acc) in out.iter_mut().enumerate() {
                let (mut hi_sum, mut lo_sum) = (0i32, 0i32);
                for half in 0..2 * BLOCKS {
                    let at = s * q6_k::BLOCK_LEN + 16 * half;
                    let (mut hi, mut lo) = (0i32, 0i32);
                    for k in 0..16 {
                        let q = value(sb, r, 16 * half + k) as i32 - 32;
                        hi += q * x.hi[at + k] as i32;
                        lo += q * x.lo[at + k] as i32;
                    }
                    let sc = sb[SCALES_AT + GROUP_ROWS * half + r] as i8 as i32;
                    hi_sum += sc * hi;
                    lo_sum += sc * lo;
                }
                let d = f16::from_le_bytes([sb[2 * r], sb[2 * r + 1]]).to_f32();
                let sum = if SHIFT == BYTE {
                    hi_sum as f32
                } else {
                    (hi_sum as f32).mul_add((1u32 << SHIFT) as f32, lo_sum as f32)
                };
                *acc = sum.mul_add(d * dx, *acc);
            }
        }
    }
}

/// Linear layer over a packed Q6_K matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` with the activation rows quantized to 16 bits (two
/// 8-bit planes per block of 32 split at `WIDE`), or to 8 bits
/// (`BYTE`) on [`QuantPath::Int8Packed`]. `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`; parallel over row groups in
/// `pool` unless the work is tiny. Each row's result is independent of the
/// other rows and of the split over threads. Slice lengths are checked
/// with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_q6k_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ6K,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    if k.path() == QuantPath::Int8Packed {
        q6k_linear::<BYTE>(k, x, rows, w, bias, y, pool, scratch)
    } else {
        q6k_linear::<WIDE>(k, x, rows, w, bias, y, pool, scratch)
    }
}

/// [`packed_q6k_linear`] with the activation rows split at `SHIFT`.
#[allow(clippy::too_many_arguments)]
fn q6k_linear<const SHIFT: u32>(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ6K,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    let in_f = w.cols();
    by_row_blocks(&w.data, x, rows, bias, y, pool, |xb, split, yt| {
        quantize_rows::<SHIFT>(k, (xb, in_f, SUPER_BLOCK), split, scratch, |rows| {
            let offsets = half_offsets(rows, in_f, split);
            let xs: Vec<Q6KInput<'_, SHIFT>> = rows
                .iter()
                .zip(offsets.chunks_exact(in_f / 16))
                .map(|(&x, half_offsets)| Q6KInput { x, half_offsets })
                .collect();
            packed_group_outputs::<Q6KFormat<SHIFT>>(k, &w.data, &xs, split, yt);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_group_products, check_packed_linear_per, check_rows_alone, check_unpacked_rows,
        extreme_acts, BoundLinear, PATHS, SCALAR_AND_X86_LEVELS,
    };
    use crate::cpu::kernels::qact::Q16Act;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::test_util::Rng;

    const QT: QuantType = QuantType::Q6K;

    /// Each row unpacked from the packed layout has exactly the values the
    /// Q6_K dequantizer gives the unpacked row.
    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(61);
        let (rows, supers) = (16, 3);
        let cols = supers * q6_k::BLOCK_LEN;
        let w = random_blocks(&mut rng, QT, rows * supers);
        let p = PackedQ6K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let groups = |g| p.data.groups(g, 1);
        check_unpacked_rows(QT, &w, [rows, cols], &groups, PackedQ6K::unpack_row);
    }

    /// The packed Q6_K layer matches the f64 product of the dequantized
    /// weights at every level and thread count on both paths (see
    /// `check_packed_linear`), for one row (decode) and row counts that do
    /// and do not fill the token tile.
    #[test]
    fn packed_q6k_linear_matches_reference() {
        let mut rng = Rng::new(62);
        let cases = [
            (1, 8, 8),
            (1, 16, 72),
            (5, 24, 16),
            (70, 8, 24),
            (131, 8, 8),
        ];
        let blocks = |rng: &mut Rng, n: usize| random_blocks(rng, QT, n / BLOCKS);
        for path in PATHS {
            check_packed_linear_per(
                path,
                &mut rng,
                (QT, SUPER_BLOCK),
                &blocks,
                &cases,
                &|k, m, x, rows, b, y, pool| {
                    packed_q6k_linear(
                        k,
                        x,
                        rows,
                        &PackedQ6K::pack(m).unwrap(),
                        b,
                        y,
                        pool,
                        &ActivationScratch::default(),
                    )
                },
            );
        }
    }

    /// Every level gives the portable kernel's bits on both paths, for
    /// each row alone and in any batch, however the groups are split over
    /// threads (batch invariance; see `check_rows_alone`).
    #[test]
    fn every_level_and_every_row_alone_give_the_same_bits() {
        let mut rng = Rng::new(63);
        let cases = [(3, 1, 64), (6, 2, 40), (45, 2, 32), (131, 1, 24)];
        for (path, &(rows, supers, out_f)) in PATHS
            .iter()
            .flat_map(|p| cases.iter().map(move |c| (*p, c)))
        {
            let in_f = supers * q6_k::BLOCK_LEN;
            let w = random_blocks(&mut rng, QT, out_f * supers);
            let p = PackedQ6K::pack(&QuantMatrix::new(QT, &w, out_f, in_f).unwrap()).unwrap();
            let x = rng.vec(rows * in_f, 1.0);
            let b = rng.vec(out_f, 1.0);
            let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
                packed_q6k_linear(
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
            check_rows_alone(path, linear, &x, rows, out_f, true, "q6_k");
        }
    }

    /// The half offsets of each of the rows `xs`.
    fn offsets_of<const SHIFT: u32>(xs: &[Q16Row<'_, SHIFT>]) -> Vec<Vec<[i32; 2]>> {
        xs.iter()
            .map(|x| {
                let mut o = vec![[0; 2]; x.hi.len() / 16];
                half_offsets_into(x.hi, x.lo, &mut o);
                o
            })
            .collect()
    }

    /// The rows `xs` with their half offsets `offsets`, as the kernels
    /// take them.
    fn inputs<'a, const SHIFT: u32>(
        xs: &[Q16Row<'a, SHIFT>],
        offsets: &'a [Vec<[i32; 2]>],
    ) -> Vec<Q6KInput<'a, SHIFT>> {
        xs.iter()
            .zip(offsets)
            .map(|(&x, o)| Q6KInput { x, half_offsets: o })
            .collect()
    }

    /// The group products of one and of two groups (the 512-bit pair) for
    /// one row to the AVX-512 pair kernel's tile (eight 8-bit rows, four
    /// 16-bit ones) split at `SHIFT` equal the portable kernel's bits at
    /// every level.
    fn check_levels<const SHIFT: u32>(rng: &mut Rng) {
        let (rows, supers) = (2 * GROUP_ROWS, 2);
        let cols = supers * q6_k::BLOCK_LEN;
        let w = random_blocks(rng, QT, rows * supers);
        let p = PackedQ6K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let acts: Vec<Q16Act<SHIFT>> = (0..Q6KFormat::<SHIFT>::PAIR_TILE_TOKENS)
            .map(|_| Q16Act::quantize_per(&rng.vec(cols, 3.0), SUPER_BLOCK))
            .collect();
        let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let offsets = offsets_of(&rows);
        let xs = inputs(&rows, &offsets);
        let levels = SCALAR_AND_X86_LEVELS;
        let what = format!("q6_k split at {SHIFT}");
        check_group_products::<Q6KFormat<SHIFT>>(p.data.groups(0, 2), &xs, &levels, &what);
    }

    #[test]
    fn group_products_equal_the_portable_one() {
        let mut rng = Rng::new(64);
        check_levels::<WIDE>(&mut rng);
        check_levels::<BYTE>(&mut rng);
    }

    /// Q6_K weights at their extremes (every value 63, or every value 0,
    /// under the largest positive or negative scales) against rows whose
    /// values (`values`, each in every column, the split's largest
    /// magnitude once per super-block so that each becomes that integer)
    /// put the planes at their extremes: every level gives the portable
    /// kernel's bits, and the AMX tiles of 16 such rows the AVX-512 bits,
    /// so no kernel's integer sums wrap or saturate there.
    fn check_extreme_levels<const SHIFT: u32>(values: &[f32]) {
        let (rows, supers) = (2 * GROUP_ROWS, 2);
        let cols = supers * q6_k::BLOCK_LEN;
        let mut w = vec![0u8; rows * supers * q6_k::BLOCK_BYTES];
        for (i, b) in w.chunks_exact_mut(q6_k::BLOCK_BYTES).enumerate() {
            // `ql` and `qh`, then the 16 signed scales, then `d`.
            b[..192].fill(if i % 3 == 2 { 0x00 } else { 0xFF });
            b[192..208].fill(if i % 2 == 0 { 0x7F } else { 0x80 });
            b[208..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        let p = PackedQ6K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let acts = extreme_acts::<SHIFT>(values, cols, SUPER_BLOCK);
        let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let offsets = offsets_of(&rows);
        let xs = inputs(&rows, &offsets);
        let levels = SCALAR_AND_X86_LEVELS;
        let what = format!("extreme q6_k split at {SHIFT}");
        check_group_products::<Q6KFormat<SHIFT>>(p.data.groups(0, 2), &xs, &levels, &what);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::kernels::packed::tests::{
                check_tile_products, extreme_tile, tile_rows,
            };
            let act = extreme_tile::<SHIFT>(values, cols, SUPER_BLOCK);
            let rows = tile_rows(&act, cols);
            let offsets = offsets_of(&rows);
            let xs = inputs(&rows, &offsets);
            check_tile_products::<Q6KFormat<SHIFT>>(p.data.groups(0, 2), &xs, &what);
        }
    }

    #[test]
    fn extreme_sums_agree_at_every_level() {
        // `-32384 = 256·(-126) - 128`, and the wide split's largest value.
        check_extreme_levels::<WIDE>(&[-32384.0, 32639.0, -32639.0]);
        check_extreme_levels::<BYTE>(&[-127.0, 127.0]);
    }

    /// The AMX tile products of 16 rows split at `SHIFT` (see
    /// `check_tile_products`), and of many tiles of rows and the rows
    /// after them (13 rows after one tile take the AVX-512 pair kernel
    /// twice with 8-bit rows): each row's outputs of four groups equal the
    /// AVX-512 products of the row alone, bit for bit.
    #[cfg(target_arch = "x86_64")]
    fn check_tiles<const SHIFT: u32>(rng: &mut Rng) {
        use crate::cpu::kernels::packed::tests::{check_tile_products, check_tiles_take_rows};
        use crate::cpu::kernels::simd::amx::TILE_ROWS;
        let (groups_n, supers) = (4, 2);
        let (rows, cols) = (groups_n * GROUP_ROWS, supers * q6_k::BLOCK_LEN);
        let w = random_blocks(rng, QT, rows * supers);
        let p = PackedQ6K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let what = format!("q6_k split at {SHIFT}");
        for n in [TILE_ROWS, 21, 29, 48, 8 * TILE_ROWS] {
            let act = Q16Act::<SHIFT>::quantize_per(&rng.vec(n * cols, 3.0), SUPER_BLOCK);
            let xs: Vec<Q16Row<'_, SHIFT>> = (0..n).map(|t| act.row().sub_row(t, cols)).collect();
            let offsets = offsets_of(&xs);
            let xs = inputs(&xs, &offsets);
            if n == TILE_ROWS {
                check_tile_products::<Q6KFormat<SHIFT>>(p.data.groups(0, 2), &xs, &what);
            }
            let groups = (p.data.groups(0, groups_n), groups_n);
            check_tiles_take_rows::<Q6KFormat<SHIFT>>(groups, &xs, &what);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tile_products_equal_avx512() {
        let mut rng = Rng::new(65);
        check_tiles::<WIDE>(&mut rng);
        check_tiles::<BYTE>(&mut rng);
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * q6_k::BLOCK_BYTES];
        let m = QuantMatrix::new(QT, &w, 7, q6_k::BLOCK_LEN).unwrap();
        let err = PackedQ6K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 34];
        let m = QuantMatrix::new(QuantType::Q8_0, &w, 8, 32).unwrap();
        let err = PackedQ6K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("not q8_0"), "{err}");
    }
}
