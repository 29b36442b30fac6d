//! f16 and bf16 weights repacked at load for register-blocked float
//! kernels, and the linear layer over them.
//!
//! Rows come in groups of eight; a group stores its columns a pair at a
//! time, 32 bytes each: the eight rows' 16-bit values at the pair's even
//! column and odd column, row after row. One 256-bit load converted to
//! f32 (F16C, or a shift for bf16) holds the pair of all eight rows, and
//! one 64-bit broadcast of an activation row's two values there
//! multiplies them at once, so the even and odd column sums of a group's
//! eight outputs build up side by side in one register (a neighbour add
//! per output at the end), and up to `HALF_TILE_TOKENS` activation rows
//! share each pass over one or two groups (the AVX-512 kernel, which
//! reads them from a tile panel, see `panels`; the AVX2 one takes one
//! group and six rows at a time, `HALF_GROUP_TILE_TOKENS`), so prefill
//! converts each weight once per twelve (six) tokens.
//!
//! The arithmetic is fixed per output: two f32 accumulators, the even
//! columns fused-multiply-added into one and the odd ones into the other,
//! in column order, then their sum. Every level (portable `mul_add`, AVX2,
//! AVX-512 with two groups per pass) and every number of activation rows
//! performs exactly these operations, so the results are the same bits
//! whatever the batch, the split over threads or the CPU.

use std::ops::Range;

use mllm_core::{Error, Result};
use rayon::ThreadPool;

use super::matmul::HalfBits;
#[cfg(target_arch = "x86_64")]
use super::packed::WeightReads;
use super::packed::{
    by_row_blocks, group_outputs, pack_blocks, stacked_row, PackedData, PackedFormat, RowOutputs,
    GROUP_ROWS,
};
use super::qact::BLOCK;
use super::qkernel::QuantKernel;
#[cfg(target_arch = "x86_64")]
use super::qkernel::SimdLevel;
use super::qmatmul::Split;
#[cfg(target_arch = "x86_64")]
use super::simd;
use super::weight_memory::{WeightArena, WeightMemory};

#[cfg(target_arch = "x86_64")]
mod panels;

/// Activation rows that share one pass over a pair of groups in the
/// AVX-512 kernel: 24 accumulators of its 32 registers, each converted
/// pair of columns feeding twelve fused multiply-adds (the conversion
/// shares the FMA ports). Prefill of SmolLM2 F16 ran 20-25 % faster than
/// with four rows, and 5-8 % faster than with eight.
pub(crate) const HALF_TILE_TOKENS: usize = 12;

/// Activation rows that share one pass over a group in the AVX2 kernel
/// (for three rows and more): 12 accumulators of the 16 AVX2 registers,
/// each converted half of a pair of columns feeding six fused
/// multiply-adds. Prefill of the 1.1B and SmolLM2 F16 files at the AVX2
/// level ran 13 % faster than with four rows (with one column per load);
/// seven spill registers (15 % slower).
pub(crate) const HALF_GROUP_TILE_TOKENS: usize = 6;

/// Bytes of one group per column.
pub(crate) const COLUMN_BYTES: usize = 2 * GROUP_ROWS;

/// Bytes of one group per pair of columns (the unit of the layout).
pub(crate) const PAIR_BYTES: usize = 2 * COLUMN_BYTES;

/// Where row `r`'s value at column `col` sits in a packed group: its
/// pair of columns, then its row, then even or odd column.
fn value_offset(r: usize, col: usize) -> usize {
    PAIR_BYTES * (col / 2) + 4 * r + 2 * (col % 2)
}

/// Bytes of one group per block of 32 columns.
const HALF_BLOCK_BYTES: usize = BLOCK * COLUMN_BYTES;

/// An f16 or bf16 matrix `[rows, cols]` repacked in groups of eight rows
/// (see the module documentation).
pub struct PackedHalf {
    data: PackedData,
    kind: HalfBits,
}

impl PackedHalf {
    /// Repacks the raw 16-bit values `bits` of a `[rows, cols]` matrix of
    /// `kind`; fails when the row count is not a multiple of eight, the
    /// column count not a multiple of 32, or `bits` holds another count.
    pub fn pack(bits: &[u16], kind: HalfBits, rows: usize, cols: usize) -> Result<PackedHalf> {
        PackedHalf::pack_with(&[bits], kind, [rows, cols], None, &|_| {})
    }

    /// [`PackedHalf::pack`] of `parts`, matrices of `cols` columns each
    /// with whole groups of rows, stacked into one of `rows` rows, into a
    /// buffer from `arena` (a buffer of its own without one), calling
    /// `copied` with each range of stacked rows (at most about
    /// [`RELEASE_BYTES`](super::packed::RELEASE_BYTES) of values at a
    /// time) once they are packed, so that a caller reading the values
    /// from a map can release them as it goes. The ranges are packed in
    /// parallel (in the current rayon pool), so they arrive in any order,
    /// from any thread.
    pub fn pack_with(
        parts: &[&[u16]],
        kind: HalfBits,
        [rows, cols]: [usize; 2],
        arena: Option<&WeightArena>,
        copied: &(dyn Fn(Range<usize>) + Sync),
    ) -> Result<PackedHalf> {
        if cols == 0 || !rows.is_multiple_of(GROUP_ROWS) || !cols.is_multiple_of(BLOCK) {
            return Err(Error::InvalidInput(format!(
                "a [{rows}, {cols}] {kind:?} matrix cannot be packed: it needs rows in groups of \
                 {GROUP_ROWS} and columns in whole blocks of {BLOCK}"
            )));
        }
        let values: usize = parts.iter().map(|p| p.len()).sum();
        if values != rows * cols {
            return Err(Error::InvalidInput(format!(
                "a [{rows}, {cols}] {kind:?} matrix needs {} values, not {values}",
                rows * cols,
            )));
        }
        if let Some(p) = parts
            .iter()
            .find(|p| !p.len().is_multiple_of(GROUP_ROWS * cols))
        {
            return Err(Error::InvalidInput(format!(
                "a part of {} {kind:?} values is not whole groups of {GROUP_ROWS} rows of {cols}",
                p.len()
            )));
        }
        // Row `r` of the stack.
        let row = |r: usize| {
            let (part, r) = stacked_row(parts.iter().map(|p| p.len() / cols), r);
            &parts[part][r * cols..][..cols]
        };
        let mut data = WeightMemory::zeroed_in(arena, rows * cols * 2)?;
        pack_blocks(
            &mut data,
            HALF_BLOCK_BYTES,
            cols / BLOCK,
            copied,
            |g, i, out| {
                for r in 0..GROUP_ROWS {
                    let row = &row(g * GROUP_ROWS + r)[i * BLOCK..][..BLOCK];
                    for (col, v) in row.iter().enumerate() {
                        out[value_offset(r, col)..][..2].copy_from_slice(&v.to_le_bytes());
                    }
                }
                Ok(())
            },
        )?;
        Ok(PackedHalf {
            data: PackedData::owned(data, rows, cols, HALF_BLOCK_BYTES),
            kind,
        })
    }

    /// Row `r`'s values from the packed bytes of its group (as f32).
    pub fn unpack_row(&self, group: &[u8], r: usize, out: &mut [f32]) {
        for (col, o) in out.iter_mut().enumerate() {
            *o = value(self.kind, group, r, col);
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

    /// The 16-bit format of the values.
    pub fn kind(&self) -> HalfBits {
        self.kind
    }
}

/// Row `r`'s value at column `col` of a packed group, as f32 (exact).
fn value(kind: HalfBits, group: &[u8], r: usize, col: usize) -> f32 {
    let at = value_offset(r, col);
    let bits = u16::from_le_bytes([group[at], group[at + 1]]);
    match kind {
        HalfBits::F16 => half::f16::from_bits(bits).to_f32(),
        HalfBits::Bf16 => half::bf16::from_bits(bits).to_f32(),
    }
}

/// The packed layout of f16 (`BF16 = false`) or bf16 values.
pub(crate) struct HalfFormat<const BF16: bool>;

impl<const BF16: bool> HalfFormat<BF16> {
    const KIND: HalfBits = if BF16 { HalfBits::Bf16 } else { HalfBits::F16 };
}

impl<const BF16: bool> PackedFormat for HalfFormat<BF16> {
    type Input<'a> = &'a [f32];
    const BLOCK_BYTES: usize = HALF_BLOCK_BYTES;
    const GROUP_TILE_TOKENS: usize = HALF_GROUP_TILE_TOKENS;

    fn blocks(x: &&[f32]) -> usize {
        x.len() / BLOCK
    }

    fn portable(group: &[u8], xs: &[&[f32]], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(Self::KIND, group, xs, out)
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(group: &[u8], xs: &[&[f32]], out: &mut [[f32; GROUP_ROWS]], reads: WeightReads) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { simd::avx2_packed_half::group_dot::<BF16>(group, xs, out, reads) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_pair(
        a: &[u8],
        b: &[u8],
        xs: &[&[f32]],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { simd::avx2_packed_half::pair_dot::<BF16>(a, b, xs, out, reads) }
    }

    /// The AVX2 pair kernel: the float layout takes no byte products.
    ///
    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx_vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[&[f32]],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract),
        // which include AVX2, FMA and F16C.
        unsafe { Self::avx2_pair(a, b, xs, out, reads) }
    }

    /// The AVX2 kernel: the float layout takes no byte products.
    ///
    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni(group: &[u8], xs: &[&[f32]], out: &mut [[f32; GROUP_ROWS]], reads: WeightReads) {
        // SAFETY: the caller guarantees the features (trait contract),
        // which include AVX2, FMA and F16C.
        unsafe { Self::avx2(group, xs, out, reads) }
    }

    /// The AVX2 pair kernel: the AVX-512 one reads tile panels, which
    /// `packed_half_linear` lays out for it (see `panels`).
    ///
    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[&[f32]],
        out: &mut [[f32; GROUP_ROWS]],
        reads: WeightReads,
    ) {
        // SAFETY: the caller guarantees the features (trait contract),
        // which include AVX2, FMA and F16C.
        unsafe { Self::avx2_pair(a, b, xs, out, reads) }
    }
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (any number of rows), in portable code: the even and the odd
/// columns fused-multiply-added in order into two accumulators, then
/// summed (see the module documentation).
pub(crate) fn group_dot(
    kind: HalfBits,
    group: &[u8],
    xs: &[&[f32]],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        for (r, o) in out.iter_mut().enumerate() {
            let (mut even, mut odd) = (0.0f32, 0.0f32);
            for (k, pair) in x.chunks_exact(2).enumerate() {
                even = pair[0].mul_add(value(kind, group, r, 2 * k), even);
                odd = pair[1].mul_add(value(kind, group, r, 2 * k + 1), odd);
            }
            *o = even + odd;
        }
    }
}

/// Linear layer over a packed f16 or bf16 matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` in f32 (see the module documentation for the exact
/// operations). `x` is `[rows, w.cols()]`, `y` `[rows, w.rows()]`; parallel
/// over row groups in `pool` unless the work is tiny. Each row's result is
/// independent of the other rows and of the split over threads. Slice
/// lengths are checked with `debug_assert!`.
pub fn packed_half_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedHalf,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
) {
    let in_f = w.cols();
    by_row_blocks(&w.data, x, rows, bias, y, pool, |xb, split, yt| {
        #[cfg(target_arch = "x86_64")]
        if matches!(k.level(), SimdLevel::Avx512 | SimdLevel::Amx) {
            return panels::panel_products(w, xb, split, yt);
        }
        let xs: Vec<&[f32]> = xb.chunks_exact(in_f).collect();
        match w.kind {
            HalfBits::F16 => half_group_outputs::<false>(k, w, &xs, split, yt),
            HalfBits::Bf16 => half_group_outputs::<true>(k, w, &xs, split, yt),
        }
    });
}

/// `packed::group_outputs` of the rows `xs` over the groups of `w`
/// (bf16 with `BF16`), [`HALF_TILE_TOKENS`] rows per tile.
fn half_group_outputs<const BF16: bool>(
    k: QuantKernel,
    w: &PackedHalf,
    xs: &[&[f32]],
    split: &Split<'_>,
    dst: &mut [f32],
) {
    let groups = |g, n| w.data.groups(g, n);
    let dot = |g: &[u8], xs: &[&[f32]], out: &mut [[f32; GROUP_ROWS]], reads| {
        k.packed_dot::<HalfFormat<BF16>>(g, xs, out, reads)
    };
    let groups = (&groups, RowOutputs::Each);
    group_outputs(groups, w.cols(), xs, HALF_TILE_TOKENS, split, dst, dot);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_copied_ranges, check_group_products, check_rows_alone, BoundLinear,
    };
    use crate::cpu::kernels::qkernel::tests::kernel_or_skip;
    use crate::cpu::kernels::qkernel::{QuantPath, SimdLevel};
    use crate::cpu::kernels::test_util::{assert_within, linear_reference, pool1, pool2, Rng};
    use half::{bf16, f16};

    pub(super) const KINDS: [HalfBits; 2] = [HalfBits::F16, HalfBits::Bf16];

    /// Random raw values of `kind` in `[-scale, scale)` and their f32 values.
    pub(super) fn random_matrix(
        rng: &mut Rng,
        kind: HalfBits,
        n: usize,
        scale: f32,
    ) -> (Vec<u16>, Vec<f32>) {
        let bits: Vec<u16> = rng
            .vec(n, scale)
            .into_iter()
            .map(|v| match kind {
                HalfBits::F16 => f16::from_f32(v).to_bits(),
                HalfBits::Bf16 => bf16::from_f32(v).to_bits(),
            })
            .collect();
        let values = bits
            .iter()
            .map(|&b| match kind {
                HalfBits::F16 => f16::from_bits(b).to_f32(),
                HalfBits::Bf16 => bf16::from_bits(b).to_f32(),
            })
            .collect();
        (bits, values)
    }

    #[test]
    fn unpacked_rows_equal_the_original_rows() {
        let mut rng = Rng::new(91);
        for kind in KINDS {
            let (rows, cols) = (16, 3 * BLOCK);
            let (bits, want) = random_matrix(&mut rng, kind, rows * cols, 2.0);
            let p = PackedHalf::pack(&bits, kind, rows, cols).unwrap();
            assert_eq!((p.rows(), p.cols(), p.kind()), (rows, cols, kind));
            for r in 0..rows {
                let mut got = vec![f32::NAN; cols];
                p.unpack_row(p.data.groups(r / GROUP_ROWS, 1), r % GROUP_ROWS, &mut got);
                assert_eq!(got, want[r * cols..(r + 1) * cols], "{kind:?} row {r}");
            }
        }
    }

    /// The layer matches the f64 product at every level and thread count,
    /// for one row (decode) and row counts that do and do not fill the
    /// token tile, and every level gives the portable kernel's bits.
    #[test]
    fn packed_half_linear_matches_reference_and_the_portable_bits() {
        let mut rng = Rng::new(92);
        let cases = [
            (1, 1, 8),
            (1, 18, 200),
            (5, 7, 64),
            (70, 9, 136),
            (131, 4, 16),
            (13, 32, 24),
            (101, 32, 16),
            (37, 512, 8),
        ];
        let scalar = kernel_or_skip(QuantPath::Int16Activations, SimdLevel::Scalar).unwrap();
        for kind in KINDS {
            for &(rows, nb, out_f) in &cases {
                let in_f = nb * BLOCK;
                let (bits, wf) = random_matrix(&mut rng, kind, out_f * in_f, 1.0);
                let p = PackedHalf::pack(&bits, kind, out_f, in_f).unwrap();
                let x = rng.vec(rows * in_f, 1.0);
                let b = rng.vec(out_f, 1.0);
                let bias = (rows % 2 == 1).then_some(&b[..]);
                let (want, mag) = linear_reference(&x, rows, in_f, &wf, out_f, bias);
                let mut portable = vec![f32::NAN; rows * out_f];
                packed_half_linear(scalar, &x, rows, &p, bias, &mut portable, &pool1());
                for level in SimdLevel::FASTEST_FIRST {
                    let Some(k) = kernel_or_skip(QuantPath::Int16Activations, level) else {
                        continue;
                    };
                    for pool in [pool1(), pool2()] {
                        let mut y = vec![f32::NAN; rows * out_f];
                        packed_half_linear(k, &x, rows, &p, bias, &mut y, &pool);
                        let what = format!("{level:?} {kind:?} rows={rows} out={out_f}");
                        assert_within(&y, &want, &mag, 1e-5, &what);
                        assert_eq!(y, portable, "{what}: not the portable kernel's bits");
                    }
                }
            }
        }
    }

    /// Batch invariance (see `check_rows_alone`).
    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(93);
        for kind in KINDS {
            for &(rows, nb, out_f) in &[
                (3, 7, 64),
                (6, 18, 200),
                (131, 4, 24),
                (14, 32, 16),
                (29, 512, 8),
            ] {
                let in_f = nb * BLOCK;
                let (bits, _) = random_matrix(&mut rng, kind, out_f * in_f, 1.0);
                let p = PackedHalf::pack(&bits, kind, out_f, in_f).unwrap();
                let x = rng.vec(rows * in_f, 1.0);
                let b = rng.vec(out_f, 1.0);
                let linear: &BoundLinear<'_> =
                    &|k, x, rows, y, pool| packed_half_linear(k, x, rows, &p, Some(&b), y, pool);
                check_rows_alone(
                    QuantPath::Int16Activations,
                    linear,
                    &x,
                    rows,
                    out_f,
                    true,
                    &format!("{kind:?}"),
                );
            }
        }
    }

    /// The group products (one group, two groups) of every level but
    /// AVX-512 (whose kernel reads tile panels, see `panels`) equal the
    /// portable ones bit for bit, for one to [`HALF_TILE_TOKENS`] rows.
    #[test]
    fn group_products_equal_at_every_level() {
        let mut rng = Rng::new(94);
        let cols = 5 * BLOCK;
        let xs: Vec<Vec<f32>> = (0..HALF_TILE_TOKENS).map(|_| rng.vec(cols, 3.0)).collect();
        let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
        let levels = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::AvxVnni];
        for kind in KINDS {
            let (bits, _) = random_matrix(&mut rng, kind, 2 * GROUP_ROWS * cols, 1.0);
            let p = PackedHalf::pack(&bits, kind, 2 * GROUP_ROWS, cols).unwrap();
            let (groups, what) = (p.data.groups(0, 2), format!("{kind:?}"));
            match kind {
                HalfBits::F16 => {
                    check_group_products::<HalfFormat<false>>(groups, &xs, &levels, &what)
                }
                HalfBits::Bf16 => {
                    check_group_products::<HalfFormat<true>>(groups, &xs, &levels, &what)
                }
            }
        }
    }

    /// One row's span of packed f16 and bf16 groups at the AVX2 level
    /// (pair by pair, through the two-group float kernel) gives each group
    /// its own bits (see `packed::tests::check_row_runs`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_one_row_span_gives_each_group_its_own_bits() {
        use crate::cpu::kernels::packed::tests::check_row_runs;
        let mut rng = Rng::new(95);
        let (groups_n, cols) = (5, 3 * BLOCK);
        let x = rng.vec(cols, 3.0);
        for kind in KINDS {
            let (bits, _) = random_matrix(&mut rng, kind, groups_n * GROUP_ROWS * cols, 1.0);
            let p = PackedHalf::pack(&bits, kind, groups_n * GROUP_ROWS, cols).unwrap();
            let (groups, what) = ((p.data.groups(0, groups_n), groups_n), format!("{kind:?}"));
            match kind {
                HalfBits::F16 => check_row_runs::<HalfFormat<false>>(groups, &x, &what),
                HalfBits::Bf16 => check_row_runs::<HalfFormat<true>>(groups, &x, &what),
            }
        }
    }

    /// The progress callback names every row once (see
    /// `check_copied_ranges`), and the parallel packing gives the rows'
    /// values.
    #[test]
    fn packing_reports_the_rows_it_copied() {
        let (rows, cols) = (8 * 1100, 1024);
        let bits: Vec<u16> = (0..rows * cols).map(|i| (i % 30011) as u16).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |r: Range<usize>| seen.lock().unwrap().push(r);
        let p = pool2().install(|| {
            PackedHalf::pack_with(&[&bits], HalfBits::F16, [rows, cols], None, &record)
        });
        let p = p.unwrap();
        check_copied_ranges(seen.into_inner().unwrap(), rows, 2 * cols);
        let mut row = vec![0.0f32; cols];
        for r in [0, 7, 8 * 550 + 3, rows - 1] {
            p.unpack_row(p.data.groups(r / GROUP_ROWS, 1), r % GROUP_ROWS, &mut row);
            let want: Vec<f32> = bits[r * cols..(r + 1) * cols]
                .iter()
                .map(|&b| f16::from_bits(b).to_f32())
                .collect();
            assert_eq!(row, want, "row {r}");
        }
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let err = PackedHalf::pack(&[0; 7 * 32], HalfBits::F16, 7, 32)
            .err()
            .unwrap();
        assert!(err.to_string().contains("[7, 32]"), "{err}");
        let err = PackedHalf::pack(&[0; 8 * 40], HalfBits::Bf16, 8, 40)
            .err()
            .unwrap();
        assert!(err.to_string().contains("whole blocks of 32"), "{err}");
        let err = PackedHalf::pack(&[0; 8], HalfBits::F16, 8, 0)
            .err()
            .unwrap();
        assert!(err.to_string().contains("[8, 0]"), "{err}");
        let err = PackedHalf::pack(&[0; 10], HalfBits::F16, 8, 32)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("needs 256 values, not 10"),
            "{err}"
        );
    }
}
