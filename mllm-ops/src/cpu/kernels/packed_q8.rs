//! Q8_0 weights repacked at load for the 16-bit-activation integer kernels
//! (the output head of most GGUF models), and the linear layer over them.
//!
//! The layout follows the packed Q4 one (see `packed`): rows in groups of
//! eight, block by block. For each group and each block of 32 columns,
//! 272 bytes hold the eight rows' f16 scales, then eight 32-byte chunks
//! where chunk `j` holds the `j`-th 4-byte word of each row's quants:
//! bytes `4r..4r + 4` of chunk `j` are the signed weights of row `r` at
//! columns `4j..4j + 4`. One 256-bit load holds four consecutive weights
//! of all eight rows, which a broadcast 4-byte activation word multiplies
//! at once, so a block's eight sums end up in the lanes of one register.
//!
//! The activations are 16-bit with the narrow plane split (`q = 128·hi +
//! lo`, `lo` in `0..=127`), or 8-bit (`BYTE`: `hi = q`, `lo = 0`, whose
//! products the kernels skip) on `QuantPath::Int8Packed`; every kernel
//! computes the exact integer sum `Σ w·q = 2^SHIFT·Σ w·hi + Σ w·lo` of a
//! block (the AVX2 one from the 16-bit values at once, the others plane by
//! plane) and then the same float steps, so all instruction sets give the
//! same results bit for bit.

use std::ops::Range;

use mllm_core::file::TensorData;
use mllm_core::{DType, Result};
use rayon::ThreadPool;

use super::packed::{
    by_row_blocks, fill_by_rows, pack_blocks, packed_group_outputs, quantize_rows, PackedData,
    PackedFormat, SourceRows, GROUP_ROWS, WIDE_TILE_TOKENS,
};
use super::qact::{ActivationScratch, Q16Row, BLOCK, BYTE, NARROW};
use super::qkernel::{QuantKernel, QuantPath, SimdLevel};
use super::qmatmul::{QuantMatrix, Split};
use super::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q8_0, QuantType};

/// Bytes of one packed block: eight f16 scales and 8 × 32 quants.
pub(crate) const Q8_PACKED_BLOCK_BYTES: usize = 2 * GROUP_ROWS + GROUP_ROWS * BLOCK;

/// A Q8_0 matrix `[rows, cols]` repacked in groups of eight rows (see the
/// module documentation).
pub struct PackedQ8 {
    data: PackedData,
}

impl PackedQ8 {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: mllm_core::op::Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not Q8_0 or when its row count is not
    /// a multiple of eight.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ8> {
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
    ) -> Result<PackedQ8> {
        let w = SourceRows::new(parts, &[QuantType::Q8_0], "q8_0")?;
        let (rows, cols) = (w.rows(), w.cols());
        let nb = cols / BLOCK;
        let mut data =
            WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * nb * Q8_PACKED_BLOCK_BYTES)?;
        pack_blocks(&mut data, Q8_PACKED_BLOCK_BYTES, nb, copied, |g, i, out| {
            for r in 0..GROUP_ROWS {
                let row = w.row(g * GROUP_ROWS + r);
                let b = &row[i * q8_0::BLOCK_BYTES..(i + 1) * q8_0::BLOCK_BYTES];
                out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
                for j in 0..BLOCK / 4 {
                    let at = 16 + 32 * j + 4 * r;
                    out[at..at + 4].copy_from_slice(&b[2 + 4 * j..2 + 4 * j + 4]);
                }
            }
            Ok(())
        })?;
        Ok(PackedQ8 {
            data: PackedData::owned(data, rows, cols, Q8_PACKED_BLOCK_BYTES),
        })
    }

    /// A `DType::Q8Packed` tensor of `[rows, cols]`, read in place.
    pub fn mapped(data: TensorData, shape: [usize; 2]) -> Result<PackedQ8> {
        let data = PackedData::mapped(data, DType::Q8Packed, shape, Q8_PACKED_BLOCK_BYTES)?;
        Ok(PackedQ8 { data })
    }

    /// The packed bytes (what a packed file stores).
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Row `r`'s values from the packed bytes of its group (`q·d`, the
    /// values Q8_0 dequantizes to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (blk, out) in group
            .chunks_exact(Q8_PACKED_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let d = half::f16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]).to_f32();
            for j in 0..BLOCK / 4 {
                for c in 0..4 {
                    out[4 * j + c] = blk[16 + 32 * j + 4 * r + c] as i8 as f32 * d;
                }
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

    /// The packed blocks of the `n` row groups from group `g` on.
    pub(crate) fn groups(&self, g: usize, n: usize) -> &[u8] {
        self.data.groups(g, n)
    }
}

/// One activation row as the packed Q8_0 kernels take it: its planes split
/// at `SHIFT` ([`NARROW`] or [`BYTE`]), per block `128 · Σ hi` over its
/// high plane (the VNNI kernels multiply offset weights `w + 128` and
/// subtract it), and its values `2^SHIFT·hi + lo` as 16-bit integers (the
/// AVX2 kernel multiplies them with `madd`). A linear layer makes only
/// what its level's kernel reads (see [`Q8Extras`]); the rest is empty.
#[derive(Clone, Copy)]
pub(crate) struct Q8Input<'a, const SHIFT: u32> {
    /// The quantized row.
    pub x: Q16Row<'a, SHIFT>,
    /// `128 · Σ hi` over each block of 32 (read by the VNNI kernels, which
    /// subtract it from a block sum straight from memory: shifted in the
    /// kernel, it took a general register's broadcast per row and block,
    /// and the AVX-512 kernel ran 7 % slower with 8-bit rows).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub hi_offsets: &'a [i32],
    /// The row's values `2^SHIFT·hi + lo` (read by the AVX2 kernel).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub values: &'a [i16],
}

/// What the Q8_0 kernel of one level reads besides the activation planes,
/// for every row of a block of rows: the high planes' block offsets at the
/// VNNI levels, the 16-bit values at the AVX2 level, nothing for the
/// portable and NEON kernels (which multiply the planes). Made only for
/// the level that runs, in the pool when the call is parallel: both made
/// on one thread for every level cost SmolLM2 Q8_0's prefill about 5 %.
struct Q8Extras {
    hi_offsets: Vec<i32>,
    values: Vec<i16>,
}

impl Q8Extras {
    /// The extras of `k`'s level for the rows `xs` (`in_f` values each).
    fn for_kernel<const SHIFT: u32>(
        k: QuantKernel,
        xs: &[Q16Row<'_, SHIFT>],
        in_f: usize,
        split: &Split<'_>,
    ) -> Self {
        let mut extras = Q8Extras {
            hi_offsets: Vec::new(),
            values: Vec::new(),
        };
        let len = xs.len() * in_f;
        match k.level() {
            SimdLevel::Amx | SimdLevel::Avx512 | SimdLevel::AvxVnni => {
                extras.hi_offsets = vec![0; len / BLOCK];
                let offsets = &mut extras.hi_offsets;
                fill_by_rows(split, in_f, xs, in_f / BLOCK, offsets, |x, out| {
                    block_offsets_into(x.hi, out)
                });
            }
            SimdLevel::Avx2 => {
                extras.values = vec![0; len];
                fill_by_rows(split, in_f, xs, in_f, &mut extras.values, |x, out| {
                    values16_into::<SHIFT>(x.hi, x.lo, out)
                });
            }
            SimdLevel::Scalar | SimdLevel::Neon => {}
        }
        extras
    }

    /// The input of row `t` (`in_f` values), whose planes are `x`.
    fn input<'a, const SHIFT: u32>(
        &'a self,
        x: Q16Row<'a, SHIFT>,
        t: usize,
        in_f: usize,
    ) -> Q8Input<'a, SHIFT> {
        let nb = in_f / BLOCK;
        Q8Input {
            x,
            hi_offsets: self.hi_offsets.get(t * nb..(t + 1) * nb).unwrap_or(&[]),
            values: self.values.get(t * in_f..(t + 1) * in_f).unwrap_or(&[]),
        }
    }
}

/// The packed Q8_0 layout (see the module documentation) for activation
/// rows split at `SHIFT`.
pub(crate) struct Q8Format<const SHIFT: u32>;

impl<const SHIFT: u32> PackedFormat for Q8Format<SHIFT> {
    type Input<'a> = Q8Input<'a, SHIFT>;
    const BLOCK_BYTES: usize = Q8_PACKED_BLOCK_BYTES;
    /// Eight rows' sums fit the AVX-512 tile's registers, and ran 1.07x
    /// (8-bit rows) and 1.08x (16-bit) faster than four.
    const PAIR_TILE_TOKENS: usize = WIDE_TILE_TOKENS;

    fn blocks(x: &Q8Input<'_, SHIFT>) -> usize {
        x.x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q8Input<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    super::packed::avx2_row_runs!(super::simd::avx2_packed_row::q8_row_run);

    super::packed::simd_group_products!(
        [],
        Q8Input<'_, SHIFT>,
        avx2_packed_q8,
        avx_vnni_packed::q8,
        vnni_packed_q8
    );

    const AMX: bool = true;

    /// As many tiles as K-quant weights take (`packed_q4k::amx_rows_for`):
    /// a call sets each pair's values into the B operands once for all
    /// of its tiles.
    #[cfg(target_arch = "x86_64")]
    fn amx_rows(cols: usize) -> usize {
        super::packed_q4k::amx_rows_for::<SHIFT>(cols)
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn amx_pairs(
        groups: &[u8],
        group_bytes: usize,
        xs: &[Q8Input<'_, SHIFT>],
        out: &mut [[f32; GROUP_ROWS]],
    ) -> bool {
        use super::simd::amx::row_tiles_then_rest;
        use super::simd::amx_packed::q8::pairs;
        let rows: Vec<Q16Row<'_, SHIFT>> = xs.iter().map(|x| x.x).collect();
        let groups = (groups, group_bytes);
        // SAFETY: the caller guarantees the AVX-512 level's features and
        // AMX with the permission to use it (trait contract).
        unsafe { row_tiles_then_rest::<Self, SHIFT>(groups, (xs, &rows), out, pairs::<SHIFT>) }
    }
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to `TILE_TOKENS` rows), in portable code: per block and row
/// `acc = fma(2^SHIFT·Σ w·hi + Σ w·lo, d·d_x, acc)` in f32.
pub(crate) fn group_dot<const SHIFT: u32>(
    group: &[u8],
    xs: &[Q8Input<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (input, out) in xs.iter().zip(out.iter_mut()) {
        let x = input.x;
        *out = [0.0; GROUP_ROWS];
        let blocks = group.chunks_exact(Q8_PACKED_BLOCK_BYTES);
        let xb = x.hi.chunks_exact(BLOCK).zip(x.lo.chunks_exact(BLOCK));
        for (blk, ((hi, lo), &dx)) in blocks.zip(xb.zip(x.d)) {
            for (r, acc) in out.iter_mut().enumerate() {
                let d = half::f16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]).to_f32();
                let (mut sum_hi, mut sum_lo) = (0i32, 0i32);
                for k in 0..BLOCK {
                    let w = blk[16 + 32 * (k / 4) + 4 * r + k % 4] as i8 as i32;
                    sum_hi += w * hi[k] as i32;
                    sum_lo += w * lo[k] as i32;
                }
                let p = (sum_hi << SHIFT) + sum_lo;
                *acc = (p as f32).mul_add(d * dx, *acc);
            }
        }
    }
}

/// `128 · Σ hi` of each block of 32 of a high plane, into `out`.
fn block_offsets_into(hi: &[i8], out: &mut [i32]) {
    for (o, b) in out.iter_mut().zip(hi.chunks_exact(BLOCK)) {
        *o = b.iter().map(|&v| v as i32).sum::<i32>() << 7;
    }
}

/// The 16-bit values `2^SHIFT·hi + lo` of planes split at `SHIFT` (at
/// most `127·128 + 127` in magnitude for [`NARROW`], 127 for [`BYTE`]),
/// into `out`.
fn values16_into<const SHIFT: u32>(hi: &[i8], lo: &[i8], out: &mut [i16]) {
    for (o, (&hi, &lo)) in out.iter_mut().zip(hi.iter().zip(lo)) {
        *o = ((hi as i16) << SHIFT) + lo as i16;
    }
}

/// Linear layer over a packed Q8_0 matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` with the activation rows quantized to 16 bits (two
/// 8-bit planes per block of 32 split at `NARROW`), or to 8 bits on
/// [`QuantPath::Int8Packed`]. `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`; parallel over row groups in
/// `pool` unless the work is tiny. Each row's result is independent of the
/// other rows and of the split over threads. Slice lengths are checked
/// with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_q8_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ8,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    if k.path() == QuantPath::Int8Packed {
        split_q8_linear::<BYTE>(k, x, rows, w, bias, y, pool, scratch)
    } else {
        split_q8_linear::<NARROW>(k, x, rows, w, bias, y, pool, scratch)
    }
}

/// [`packed_q8_linear`] with the activation rows split at `SHIFT`.
#[allow(clippy::too_many_arguments)]
fn split_q8_linear<const SHIFT: u32>(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ8,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    let in_f = w.cols();
    by_row_blocks(&w.data, x, rows, bias, y, pool, |xb, split, yt| {
        quantize_rows::<SHIFT>(k, (xb, in_f, BLOCK), split, scratch, |rows| {
            let extras = Q8Extras::for_kernel(k, rows, in_f, split);
            let xs: Vec<Q8Input<'_, SHIFT>> = rows
                .iter()
                .enumerate()
                .map(|(t, &x)| extras.input(x, t, in_f))
                .collect();
            packed_group_outputs::<Q8Format<SHIFT>>(k, &w.data, &xs, split, yt);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_group_dots, check_group_products, check_packed_linear, check_rows_alone,
        check_unpacked_rows, BoundLinear, PATHS, SCALAR_AND_X86_LEVELS,
    };
    use crate::cpu::kernels::qact::Q16Act;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::test_util::Rng;

    /// Q8_0 blocks whose quants include the extremes −128 and 127.
    fn blocks_with_extremes(rng: &mut Rng, n: usize) -> Vec<u8> {
        let mut w = random_blocks(rng, QuantType::Q8_0, n);
        for b in w.chunks_exact_mut(q8_0::BLOCK_BYTES).step_by(3) {
            b[2] = 0x80;
            b[5] = 0x7F;
        }
        w
    }

    /// Both extras of a row (see `Q8Extras`), whatever the level.
    fn both_extras<const SHIFT: u32>(x: &Q16Row<'_, SHIFT>) -> (Vec<i32>, Vec<i16>) {
        let mut sums = vec![0; x.d.len()];
        block_offsets_into(x.hi, &mut sums);
        let mut values = vec![0; x.hi.len()];
        values16_into::<SHIFT>(x.hi, x.lo, &mut values);
        (sums, values)
    }

    /// Packing keeps every value: the portable packed dot of rows split at
    /// `SHIFT` equals the f64 dot of each unpacked row's dequantized
    /// weights with the dequantized activations.
    fn check_packed_dot<const SHIFT: u32>(rng: &mut Rng) {
        let (rows, nb) = (16, 5);
        let w = blocks_with_extremes(rng, rows * nb);
        let m = QuantMatrix::new(QuantType::Q8_0, &w, rows, nb * BLOCK).unwrap();
        let p = PackedQ8::pack(&m).unwrap();
        let a = Q16Act::<SHIFT>::quantize(&rng.vec(nb * BLOCK, 1.0));
        let xr = a.row();
        let (sums, values) = both_extras(&xr);
        let input = Q8Input {
            x: xr,
            hi_offsets: &sums,
            values: &values,
        };
        let what = format!("split at {SHIFT}");
        check_group_dots(QuantType::Q8_0, &w, rows, &xr, &what, |g| {
            let mut out = [[0.0; GROUP_ROWS]];
            group_dot(p.groups(g, 1), &[input], &mut out);
            out[0]
        });
    }

    #[test]
    fn packed_dot_equals_row_dot() {
        let mut rng = Rng::new(51);
        check_packed_dot::<NARROW>(&mut rng);
        check_packed_dot::<BYTE>(&mut rng);
    }

    /// Each row unpacked from the packed layout has exactly the values the
    /// Q8_0 dequantizer gives the unpacked row.
    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(44);
        let (rows, cols) = (16, 3 * BLOCK);
        let w = blocks_with_extremes(&mut rng, rows * cols / BLOCK);
        let m = QuantMatrix::new(QuantType::Q8_0, &w, rows, cols).unwrap();
        let p = PackedQ8::pack(&m).unwrap();
        let groups = |g| p.groups(g, 1);
        check_unpacked_rows(
            QuantType::Q8_0,
            &w,
            [rows, cols],
            &groups,
            PackedQ8::unpack_row,
        );
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * q8_0::BLOCK_BYTES];
        let m = QuantMatrix::new(QuantType::Q8_0, &w, 7, 32).unwrap();
        let err = PackedQ8::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 20];
        let m = QuantMatrix::new(QuantType::Q4_1, &w, 8, 32).unwrap();
        let err = PackedQ8::pack(&m).err().unwrap();
        assert!(err.to_string().contains("q4_1"), "{err}");
    }

    /// The linear layer matches the reference on both paths (see
    /// `packed::tests::check_packed_linear`) for one row and for row
    /// counts that do and do not fill the token tile and the row block.
    #[test]
    fn packed_q8_linear_matches_reference() {
        let mut rng = Rng::new(52);
        // The last case's first 128 rows make their extras in the pool.
        let cases = [
            (1, 3, 8),
            (1, 18, 200),
            (5, 7, 64),
            (130, 2, 16),
            (130, 18, 8),
        ];
        for path in PATHS {
            check_packed_linear(
                path,
                &mut rng,
                QuantType::Q8_0,
                &blocks_with_extremes,
                &cases,
                &|k, m, x, rows, b, y, pool| {
                    packed_q8_linear(
                        k,
                        x,
                        rows,
                        &PackedQ8::pack(m).unwrap(),
                        b,
                        y,
                        pool,
                        &ActivationScratch::default(),
                    )
                },
            );
        }
    }

    /// Every instruction set gives the portable results bit for bit on
    /// both paths, and each activation row gets exactly what it gets
    /// alone, whatever shares its tile and however the groups are split
    /// over threads (see `check_rows_alone`).
    #[test]
    fn every_level_and_every_row_alone_give_the_same_bits() {
        let mut rng = Rng::new(53);
        // Two AMX tiles of 16 rows, then a full AVX-512 tile of eight rows
        // and a partial one; full tiles of four and a partial one elsewhere.
        let (rows, nb, out_f) = (2 * 16 + WIDE_TILE_TOKENS + 3, 18, 48);
        let in_f = nb * BLOCK;
        let w = blocks_with_extremes(&mut rng, out_f * nb);
        let m = QuantMatrix::new(QuantType::Q8_0, &w, out_f, in_f).unwrap();
        let p = PackedQ8::pack(&m).unwrap();
        let x = rng.vec(rows * in_f, 4.0);
        let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
            packed_q8_linear(k, x, rows, &p, None, y, pool, &ActivationScratch::default())
        };
        for path in PATHS {
            check_rows_alone(path, linear, &x, rows, out_f, true, "q8_0");
        }
    }

    /// The group products of one and of two groups (the 512-bit pair) for
    /// one to all the eight rows of the AVX-512 tile split at `SHIFT`
    /// equal the portable kernel's bits at every level, with weights at the
    /// extremes −128 and 127.
    fn check_levels<const SHIFT: u32>(rng: &mut Rng) {
        let (rows, nb) = (2 * GROUP_ROWS, 6);
        let w = blocks_with_extremes(rng, rows * nb);
        let m = QuantMatrix::new(QuantType::Q8_0, &w, rows, nb * BLOCK).unwrap();
        let p = PackedQ8::pack(&m).unwrap();
        let acts: Vec<Q16Act<SHIFT>> = (0..Q8Format::<SHIFT>::PAIR_TILE_TOKENS)
            .map(|_| Q16Act::quantize(&rng.vec(nb * BLOCK, 3.0)))
            .collect();
        let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let extras: Vec<(Vec<i32>, Vec<i16>)> = rows.iter().map(both_extras).collect();
        let xs = inputs(&rows, &extras);
        let levels = SCALAR_AND_X86_LEVELS;
        let what = format!("q8_0 split at {SHIFT}");
        check_group_products::<Q8Format<SHIFT>>(p.groups(0, 2), &xs, &levels, &what);
        #[cfg(target_arch = "x86_64")]
        {
            let tile = crate::cpu::kernels::simd::amx::TILE_ROWS;
            let act = Q16Act::<SHIFT>::quantize(&rng.vec(tile * nb * BLOCK, 3.0));
            let rows: Vec<Q16Row<'_, SHIFT>> = (0..tile)
                .map(|t| act.row().sub_row(t, nb * BLOCK))
                .collect();
            let extras: Vec<(Vec<i32>, Vec<i16>)> = rows.iter().map(both_extras).collect();
            let xs = inputs(&rows, &extras);
            let groups = p.groups(0, 2);
            crate::cpu::kernels::packed::tests::check_tile_products::<Q8Format<SHIFT>>(
                groups, &xs, &what,
            );
        }
    }

    #[test]
    fn group_products_equal_the_portable_one() {
        let mut rng = Rng::new(54);
        check_levels::<NARROW>(&mut rng);
        check_levels::<BYTE>(&mut rng);
    }

    /// Q8_0 weights at their extremes (every value −128, or every value
    /// 127) against rows whose values (`values`, each in every column,
    /// the split's largest magnitude once per block so that each becomes
    /// that integer) put the planes at their extremes: every level gives
    /// the portable kernel's bits, and the AMX tiles of 16 such rows the
    /// AVX-512 bits, so no kernel's integer sums wrap or saturate there.
    fn check_extreme_levels<const SHIFT: u32>(values: &[f32]) {
        use crate::cpu::kernels::packed::tests::{extreme_acts, extreme_blocks};
        let (rows, nb) = (2 * GROUP_ROWS, 3);
        let cols = nb * BLOCK;
        let w = extreme_blocks(QuantType::Q8_0, rows * nb, [0x80, 0x7F]);
        let m = QuantMatrix::new(QuantType::Q8_0, &w, rows, cols).unwrap();
        let p = PackedQ8::pack(&m).unwrap();
        let acts = extreme_acts::<SHIFT>(values, cols, BLOCK);
        let rows: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
        let extras: Vec<(Vec<i32>, Vec<i16>)> = rows.iter().map(both_extras).collect();
        let xs = inputs(&rows, &extras);
        let levels = SCALAR_AND_X86_LEVELS;
        let what = format!("extreme q8_0 split at {SHIFT}");
        check_group_products::<Q8Format<SHIFT>>(p.groups(0, 2), &xs, &levels, &what);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu::kernels::packed::tests::{
                check_tile_products, extreme_tile, tile_rows,
            };
            let act = extreme_tile::<SHIFT>(values, cols, BLOCK);
            let rows = tile_rows(&act, cols);
            let extras: Vec<(Vec<i32>, Vec<i16>)> = rows.iter().map(both_extras).collect();
            check_tile_products::<Q8Format<SHIFT>>(p.groups(0, 2), &inputs(&rows, &extras), &what);
        }
    }

    #[test]
    fn extreme_sums_agree_at_every_level() {
        // The narrow split's `hi = −127, lo = 127`, `hi = 126, lo = 127`
        // and its largest magnitudes (`lo = 0`).
        check_extreme_levels::<NARROW>(&[-16129.0, 16255.0, -16256.0, 16256.0]);
        check_extreme_levels::<BYTE>(&[-127.0, 127.0]);
    }

    /// The rows `rows` with their extras `extras` (as [`both_extras`]
    /// gives them) as the kernels' inputs.
    fn inputs<'a, const SHIFT: u32>(
        rows: &[Q16Row<'a, SHIFT>],
        extras: &'a [(Vec<i32>, Vec<i16>)],
    ) -> Vec<Q8Input<'a, SHIFT>> {
        rows.iter()
            .zip(extras)
            .map(|(&x, (s, v))| Q8Input {
                x,
                hi_offsets: s,
                values: v,
            })
            .collect()
    }

    /// Decode's row runs of packed Q8_0 groups (see
    /// `packed::tests::check_row_runs`), for rows split at `NARROW` and
    /// 8-bit rows, at SmolLM2's width and an odd one, with the weights'
    /// extremes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_row_run_gives_each_group_its_own_bits() {
        let mut rng = Rng::new(57);
        check_row_runs::<NARROW>(&mut rng);
        check_row_runs::<BYTE>(&mut rng);
    }

    #[cfg(target_arch = "x86_64")]
    fn check_row_runs<const SHIFT: u32>(rng: &mut Rng) {
        for (groups_n, nb) in [(5, 18), (3, 7)] {
            let (rows, cols) = (groups_n * GROUP_ROWS, nb * BLOCK);
            let w = blocks_with_extremes(rng, rows * nb);
            let m = QuantMatrix::new(QuantType::Q8_0, &w, rows, cols).unwrap();
            let p = PackedQ8::pack(&m).unwrap();
            let act = Q16Act::<SHIFT>::quantize(&rng.vec(cols, 3.0));
            let extras = [both_extras(&act.row())];
            let x = inputs(&[act.row()], &extras)[0];
            let what = format!("q8_0 split at {SHIFT}");
            crate::cpu::kernels::packed::tests::check_row_runs::<Q8Format<SHIFT>>(
                (p.groups(0, groups_n), groups_n),
                x,
                &what,
            );
        }
    }

    /// The tile kernel takes many tiles of rows at once (see
    /// `packed::tests::MANY_TILE_ROWS`), over two spans of blocks and part
    /// of a third, and each row gets the AVX-512 products of the row alone,
    /// bit for bit (see `check_tiles_take_rows`).
    #[cfg(target_arch = "x86_64")]
    fn check_many_tiles<const SHIFT: u32>(rng: &mut Rng) {
        use crate::cpu::kernels::packed::tests::check_tiles_take_rows;
        let (groups_n, nb) = (4, 2 * crate::cpu::kernels::simd::amx::SPAN + 2);
        let (rows, cols) = (groups_n * GROUP_ROWS, nb * BLOCK);
        let w = blocks_with_extremes(rng, rows * nb);
        let p =
            PackedQ8::pack(&QuantMatrix::new(QuantType::Q8_0, &w, rows, cols).unwrap()).unwrap();
        let what = format!("q8_0 split at {SHIFT}");
        for n in crate::cpu::kernels::packed::tests::MANY_TILE_ROWS {
            let act = Q16Act::<SHIFT>::quantize(&rng.vec(n * cols, 3.0));
            let rows: Vec<Q16Row<'_, SHIFT>> = (0..n).map(|t| act.row().sub_row(t, cols)).collect();
            let extras: Vec<(Vec<i32>, Vec<i16>)> = rows.iter().map(both_extras).collect();
            let xs = inputs(&rows, &extras);
            check_tiles_take_rows::<Q8Format<SHIFT>>((p.groups(0, groups_n), groups_n), &xs, &what);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tiles_take_many_rows() {
        let mut rng = Rng::new(56);
        check_many_tiles::<NARROW>(&mut rng);
        check_many_tiles::<BYTE>(&mut rng);
    }
}
