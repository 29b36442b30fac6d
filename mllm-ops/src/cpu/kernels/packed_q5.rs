//! Q5_0 and Q5_1 weights repacked at load for the 16-bit-activation integer
//! kernels, and the linear layer over them.
//!
//! The layout is the packed Q4 one (see `packed`) plus a plane of fifth
//! bits: per group of eight rows and block of 32 columns, 192 bytes hold
//! the eight rows' f16 scales `d`, their f16 offsets `m` (Q5_0's `−16·d`),
//! the four 32-byte nibble chunks of the packed Q4 layout and one 32-byte
//! word of fifth bits, where byte `4r + k` holds, at bits `2c` and
//! `2c + 1`, those of row `r`'s columns `4c + k` and `16 + 4c + k`. A
//! block's values are `d·q + m` with `q` in `0..=31`, the values Q5_0 and
//! Q5_1 dequantize to, and its contribution `d·d_x·Σ q·q_x + m·s_x` is the
//! packed Q4 block step.

use std::ops::Range;

use half::f16;
use mllm_core::{Error, Result};
use rayon::ThreadPool;

use super::packed::{
    pack_blocks, wide_packed_linear, PackedData, PackedFormat, SourceRows, GROUP_ROWS, NIBBLES_AT,
    TILE_TOKENS, WIDE_TILE_TOKENS,
};
use super::qact::{ActivationScratch, Q16Row, BLOCK, BYTE, WIDE};
use super::qkernel::{QuantKernel, QuantPath};
use super::qmatmul::QuantMatrix;
use super::weight_memory::{WeightArena, WeightMemory};
use crate::quant::{q5_0, QuantType};

/// Offset of the fifth bits in a block's bits (after its nibbles).
pub(crate) const TOP_IN_BITS: usize = GROUP_ROWS * BLOCK / 2;
/// Bytes of a block's bits: the nibbles, then the fifth bits.
pub(crate) const BLOCK_BITS: usize = TOP_IN_BITS + GROUP_ROWS * BLOCK / 8;
/// Bytes of one packed block.
pub(crate) const Q5_PACKED_BLOCK_BYTES: usize = NIBBLES_AT + BLOCK_BITS;

/// A Q5_0 or Q5_1 matrix `[rows, cols]` repacked in groups of eight rows
/// (see the module documentation).
pub struct PackedQ5 {
    data: PackedData,
}

impl PackedQ5 {
    /// Makes the products give `act(gate) · up` (see
    /// `packed::RowOutputs::Gated`): for a matrix packed from a gate and an
    /// up weight group by group in turn.
    pub(crate) fn gate(&mut self, act: mllm_core::op::Activation) -> Result<()> {
        self.data.gate(act)
    }

    /// Repacks `w`; fails when it is not Q5_0 or Q5_1, when its row count
    /// is not a multiple of eight, or when a Q5_0 offset `−16·d` overflows
    /// f16.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ5> {
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
    ) -> Result<PackedQ5> {
        let w = SourceRows::new(parts, &[QuantType::Q5_0, QuantType::Q5_1], "q5")?;
        let (rows, cols, qt) = (w.rows(), w.cols(), w.quant_type());
        let nb = cols / BLOCK;
        let mut data =
            WeightMemory::zeroed_in(arena, rows / GROUP_ROWS * nb * Q5_PACKED_BLOCK_BYTES)?;
        pack_blocks(&mut data, Q5_PACKED_BLOCK_BYTES, nb, copied, |g, i, out| {
            for r in 0..GROUP_ROWS {
                let (d, m, q) = block_parts(qt, w.row(g * GROUP_ROWS + r), i)?;
                out[2 * r..2 * r + 2].copy_from_slice(&d);
                out[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&m);
                place_values(&mut out[NIBBLES_AT..], r, q);
            }
            Ok(())
        })?;
        Ok(PackedQ5 {
            data: PackedData::owned(data, rows, cols, Q5_PACKED_BLOCK_BYTES),
        })
    }

    /// Row `r`'s values from the packed bytes of its group (`d·q + m`, the
    /// values Q5_0 and Q5_1 dequantize to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (blk, out) in group
            .chunks_exact(Q5_PACKED_BLOCK_BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let (d, m) = scales(blk, r);
            for (col, o) in out.iter_mut().enumerate() {
                *o = d * value(&blk[NIBBLES_AT..], r, col) as f32 + m;
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

/// The f16 scale, the f16 offset and the 32 five-bit values of block `i`
/// of a Q5_0 or Q5_1 row.
fn block_parts(qt: QuantType, row: &[u8], i: usize) -> Result<([u8; 2], [u8; 2], [u8; 32])> {
    let bytes = qt.block_bytes();
    let b = &row[i * bytes..(i + 1) * bytes];
    let d = [b[0], b[1]];
    if qt == QuantType::Q5_1 {
        return Ok((d, [b[2], b[3]], q5_0::five_bits(b, 4)));
    }
    let m = f16::from_f32(-16.0 * f16::from_le_bytes(d).to_f32());
    if !m.is_finite() {
        return Err(Error::InvalidInput(format!(
            "q5_0 scale {} is too large to pack",
            f16::from_le_bytes(d)
        )));
    }
    Ok((d, m.to_le_bytes(), q5_0::five_bits(b, 2)))
}

/// Where the bits of column `col` (`0..32`) of row `r` live in a block's
/// bits: the nibble byte and its shift, the fifth-bit byte and its shift.
fn bit_places(r: usize, col: usize) -> (usize, u32, usize, u32) {
    let (half, k) = (col / 16, col % 16);
    let (c, lane) = (k / 4, 4 * r + k % 4);
    (
        32 * c + lane,
        4 * half as u32,
        TOP_IN_BITS + lane,
        (2 * c + half) as u32,
    )
}

/// Writes row `r`'s 32 five-bit values `q` into a block's bits, as
/// [`bit_places`] says: per column pair `(4c + k, 16 + 4c + k)` one byte of
/// nibbles, and per `k` one byte of fifth bits. Every byte is stored,
/// never read: a first read of a fresh page of the output would map the
/// shared zero page, and the store after it would have to copy it and
/// flush the other threads' TLBs.
pub(crate) fn place_values(bits: &mut [u8], r: usize, q: [u8; BLOCK]) {
    for k in 0..4 {
        let lane = 4 * r + k;
        let mut top = 0;
        for c in 0..4 {
            let (a, b) = (q[4 * c + k], q[16 + 4 * c + k]);
            bits[32 * c + lane] = (a & 15) | ((b & 15) << 4);
            top |= ((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1));
        }
        bits[TOP_IN_BITS + lane] = top;
    }
}

/// The five-bit value at column `col` of row `r` in a block's bits.
pub(crate) fn value(bits: &[u8], r: usize, col: usize) -> u8 {
    let (nib, nib_shift, top, top_shift) = bit_places(r, col);
    ((bits[nib] >> nib_shift) & 15) | (((bits[top] >> top_shift) & 1) << 4)
}

/// Row `r`'s integer sum `Σ q·(2^SHIFT·hi + lo)` over a block's bits and
/// one activation block (planes `hi`, `lo` split at `SHIFT`).
pub(crate) fn five_bit_block_sum<const SHIFT: u32>(
    bits: &[u8],
    r: usize,
    hi: &[i8],
    lo: &[i8],
) -> i32 {
    (0..BLOCK)
        .map(|k| value(bits, r, k) as i32 * (((hi[k] as i32) << SHIFT) + lo[k] as i32))
        .sum()
}

/// Row `r`'s scale `d` and offset `m` in a packed block.
fn scales(blk: &[u8], r: usize) -> (f32, f32) {
    let f = |at: usize| f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32();
    (f(2 * r), f(16 + 2 * r))
}

/// The packed Q5 layout (see the module documentation) for activation
/// rows split at `SHIFT` ([`WIDE`] or `BYTE`).
pub(crate) struct Q5Format<const SHIFT: u32>;

impl<const SHIFT: u32> PackedFormat for Q5Format<SHIFT> {
    type Input<'a> = Q16Row<'a, SHIFT>;
    const BLOCK_BYTES: usize = Q5_PACKED_BLOCK_BYTES;
    /// Eight 8-bit rows per AVX-512 pair call: each chunk's five-bit
    /// values, a dozen instructions to rebuild, then serve twice the rows
    /// (SmolLM2 Q4_K_M's pp512 ran 1.08x faster than with four); 16-bit
    /// rows, whose sums take twice the registers, ran slower with eight
    /// (0.88-0.98x).
    const PAIR_TILE_TOKENS: usize = if SHIFT == BYTE {
        WIDE_TILE_TOKENS
    } else {
        TILE_TOKENS
    };

    fn blocks(x: &Q16Row<'_, SHIFT>) -> usize {
        x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q16Row<'_, SHIFT>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    super::packed::avx2_row_runs!(super::simd::avx2_packed_q5::row_run);

    super::packed::simd_group_products!(
        [],
        Q16Row<'_, SHIFT>,
        avx2_packed_q5,
        avx_vnni_packed::q5,
        vnni_packed_q5
    );

    super::packed::amx_pairs_of_rows!(super::simd::amx_packed::q5::pairs);
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to `TILE_TOKENS` rows), in portable code: per block and row
/// `d·d_x·Σ q_w q_x + m·s_x`, accumulated in f32.
pub(crate) fn group_dot<const SHIFT: u32>(
    group: &[u8],
    xs: &[Q16Row<'_, SHIFT>],
    out: &mut [[f32; GROUP_ROWS]],
) {
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        *out = [0.0; GROUP_ROWS];
        let blocks = group.chunks_exact(Q5_PACKED_BLOCK_BYTES);
        let xb = x.hi.chunks_exact(BLOCK).zip(x.lo.chunks_exact(BLOCK));
        for ((blk, (hi, lo)), (&dx, &sx)) in blocks.zip(xb).zip(x.d.iter().zip(x.s)) {
            for (r, acc) in out.iter_mut().enumerate() {
                let (d, m) = scales(blk, r);
                let sum = five_bit_block_sum::<SHIFT>(&blk[NIBBLES_AT..], r, hi, lo);
                *acc += d * dx * sum as f32 + m * sx;
            }
        }
    }
}

/// Linear layer over a packed Q5 matrix: `y[t, o] = Σ_i x[t, i] · W[o, i] +
/// bias[o]` with the activation rows quantized to 16 bits (two 8-bit
/// planes per block of 32 split at `WIDE`). `x` is `[rows, w.cols()]`,
/// `y` `[rows, w.rows()]`; parallel over row groups in `pool` unless the
/// work is tiny. Each row's result is independent of the other rows and of
/// the split over threads. Slice lengths are checked with `debug_assert!`.
#[allow(clippy::too_many_arguments)]
pub fn packed_q5_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ5,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
    scratch: &ActivationScratch,
) {
    if k.path() == QuantPath::Int8Packed {
        wide_packed_linear::<Q5Format<BYTE>, BYTE>(k, x, rows, &w.data, bias, y, pool, scratch)
    } else {
        wide_packed_linear::<Q5Format<WIDE>, WIDE>(k, x, rows, &w.data, bias, y, pool, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_group_products, check_packed_linear, check_rows_alone, check_unpacked_rows,
        BoundLinear, PATHS,
    };
    use crate::cpu::kernels::qact::Q16Act;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::qkernel::SimdLevel;
    use crate::cpu::kernels::test_util::Rng;

    const TYPES: [QuantType; 2] = [QuantType::Q5_0, QuantType::Q5_1];

    /// Each row unpacked from the packed layout has exactly the values the
    /// Q5_0 / Q5_1 dequantizer gives the unpacked row.
    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(71);
        for qt in TYPES {
            let (rows, cols) = (16, 5 * BLOCK);
            let w = random_blocks(&mut rng, qt, rows * cols / BLOCK);
            let p = PackedQ5::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
            let groups = |g| p.data.groups(g, 1);
            check_unpacked_rows(qt, &w, [rows, cols], &groups, PackedQ5::unpack_row);
        }
    }

    /// The packed Q5 layer matches the f64 product of the dequantized
    /// weights at every level and thread count on both paths (see
    /// `check_packed_linear`).
    #[test]
    fn packed_q5_linear_matches_reference() {
        let mut rng = Rng::new(72);
        let cases = [
            (1, 3, 8),
            (1, 18, 200),
            (5, 7, 64),
            (70, 9, 136),
            (131, 4, 16),
        ];
        for (qt, path) in TYPES.into_iter().flat_map(|qt| PATHS.map(|p| (qt, p))) {
            let blocks = |rng: &mut Rng, n| random_blocks(rng, qt, n);
            check_packed_linear(
                path,
                &mut rng,
                qt,
                &blocks,
                &cases,
                &|k, m, x, rows, b, y, pool| {
                    packed_q5_linear(
                        k,
                        x,
                        rows,
                        &PackedQ5::pack(m).unwrap(),
                        b,
                        y,
                        pool,
                        &ActivationScratch::default(),
                    )
                },
            );
        }
    }

    /// Batch invariance on both paths (see `check_rows_alone`).
    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(73);
        for (qt, path) in TYPES.into_iter().flat_map(|qt| PATHS.map(|p| (qt, p))) {
            for &(rows, nb, out_f) in &[(3, 7, 64), (6, 18, 200), (131, 4, 24)] {
                let in_f = nb * BLOCK;
                let w = random_blocks(&mut rng, qt, out_f * nb);
                let p = PackedQ5::pack(&QuantMatrix::new(qt, &w, out_f, in_f).unwrap()).unwrap();
                let x = rng.vec(rows * in_f, 1.0);
                let linear: &BoundLinear<'_> = &|k, x, rows, y, pool| {
                    packed_q5_linear(k, x, rows, &p, None, y, pool, &ActivationScratch::default())
                };
                check_rows_alone(path, linear, &x, rows, out_f, false, &qt.to_string());
            }
        }
    }

    /// The AVX-VNNI and AVX-512 VNNI group products (one group, two
    /// groups) of rows split at `SHIFT` equal the AVX2 ones bit for bit.
    fn check_levels<const SHIFT: u32>(rng: &mut Rng) {
        for qt in TYPES {
            let nb = 9;
            let w = random_blocks(rng, qt, 2 * GROUP_ROWS * nb);
            let m = QuantMatrix::new(qt, &w, 2 * GROUP_ROWS, nb * BLOCK).unwrap();
            let p = PackedQ5::pack(&m).unwrap();
            let acts: Vec<Q16Act<SHIFT>> = (0..Q5Format::<SHIFT>::PAIR_TILE_TOKENS)
                .map(|_| Q16Act::quantize(&rng.vec(nb * BLOCK, 3.0)))
                .collect();
            let xs: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
            let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
            let what = format!("{qt} split at {SHIFT}");
            check_group_products::<Q5Format<SHIFT>>(p.data.groups(0, 2), &xs, &levels, &what);
            #[cfg(target_arch = "x86_64")]
            {
                let tile = crate::cpu::kernels::simd::amx::TILE_ROWS;
                let act = Q16Act::<SHIFT>::quantize(&rng.vec(tile * nb * BLOCK, 3.0));
                let xs: Vec<Q16Row<'_, SHIFT>> = (0..tile)
                    .map(|t| act.row().sub_row(t, nb * BLOCK))
                    .collect();
                let groups = p.data.groups(0, 2);
                crate::cpu::kernels::packed::tests::check_tile_products::<Q5Format<SHIFT>>(
                    groups, &xs, &what,
                );
            }
        }
    }

    /// Q5_0 and Q5_1 weights at their extremes (every value 31, or every
    /// value 0) against rows whose values (`values`, each in every
    /// column, the split's largest magnitude once per block so that each
    /// becomes that integer) put the planes at their extremes: every level
    /// gives the AVX2 bits, and the AMX tiles of 16 such rows the AVX-512
    /// bits, so no kernel's integer sums wrap or saturate there.
    fn check_extreme_levels<const SHIFT: u32>(values: &[f32]) {
        use crate::cpu::kernels::packed::tests::{check_near_scalar, extreme_acts, extreme_blocks};
        for qt in TYPES {
            let nb = 3;
            let (rows, cols) = (2 * GROUP_ROWS, nb * BLOCK);
            let w = extreme_blocks(qt, rows * nb, [0xFF, 0x00]);
            let p = PackedQ5::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
            let acts = extreme_acts::<SHIFT>(values, cols, BLOCK);
            let xs: Vec<Q16Row<'_, SHIFT>> = acts.iter().map(|a| a.row()).collect();
            let levels = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Avx512];
            let what = format!("extreme {qt} split at {SHIFT}");
            let groups = p.data.groups(0, 2);
            check_group_products::<Q5Format<SHIFT>>(groups, &xs, &levels, &what);
            check_near_scalar::<Q5Format<SHIFT>>(groups, &xs, &what);
            #[cfg(target_arch = "x86_64")]
            {
                use crate::cpu::kernels::packed::tests::{
                    check_tile_products, extreme_tile, tile_rows,
                };
                let act = extreme_tile::<SHIFT>(values, cols, BLOCK);
                check_tile_products::<Q5Format<SHIFT>>(groups, &tile_rows(&act, cols), &what);
            }
        }
    }

    #[test]
    fn extreme_sums_agree_at_every_level() {
        // `-32384 = 256·(-126) - 128`, and the wide split's largest value.
        check_extreme_levels::<WIDE>(&[-32384.0, 32639.0, -32639.0]);
        check_extreme_levels::<BYTE>(&[-127.0, 127.0]);
    }

    /// Decode's row runs of packed Q5 groups (see
    /// `packed::tests::check_row_runs`), for 16-bit and 8-bit rows, at
    /// SmolLM2's width and an odd one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_row_run_gives_each_group_its_own_bits() {
        use crate::cpu::kernels::packed::tests::check_row_runs;
        let mut rng = Rng::new(76);
        for qt in TYPES {
            for (groups_n, nb) in [(5, 18), (3, 7)] {
                let (rows, cols) = (groups_n * GROUP_ROWS, nb * BLOCK);
                let w = random_blocks(&mut rng, qt, rows * nb);
                let p = PackedQ5::pack(&QuantMatrix::new(qt, &w, rows, cols).unwrap()).unwrap();
                let groups = (p.data.groups(0, groups_n), groups_n);
                let x = rng.vec(cols, 3.0);
                let wide = Q16Act::<WIDE>::quantize(&x);
                check_row_runs::<Q5Format<WIDE>>(groups, wide.row(), &format!("{qt} 16-bit"));
                let byte = Q16Act::<BYTE>::quantize(&x);
                check_row_runs::<Q5Format<BYTE>>(groups, byte.row(), &format!("{qt} 8-bit"));
            }
        }
    }

    #[test]
    fn vnni_group_dot_equals_avx2() {
        let mut rng = Rng::new(74);
        check_levels::<WIDE>(&mut rng);
        check_levels::<BYTE>(&mut rng);
    }

    /// The Q5 tile kernel takes many tiles of rows at once (see
    /// `packed::tests::check_blocks_take_many_tiles`).
    #[cfg(target_arch = "x86_64")]
    fn check_many_tiles<const SHIFT: u32>(rng: &mut Rng) {
        use crate::cpu::kernels::packed::tests::check_blocks_take_many_tiles;
        check_blocks_take_many_tiles::<Q5Format<SHIFT>, SHIFT>(rng, &TYPES, |m, groups_n| {
            PackedQ5::pack(m).unwrap().data.groups(0, groups_n).to_vec()
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_tiles_take_many_rows() {
        let mut rng = Rng::new(75);
        check_many_tiles::<WIDE>(&mut rng);
        check_many_tiles::<BYTE>(&mut rng);
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * 22];
        let m = QuantMatrix::new(QuantType::Q5_0, &w, 7, 32).unwrap();
        let err = PackedQ5::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 34];
        let m = QuantMatrix::new(QuantType::Q8_0, &w, 8, 32).unwrap();
        let err = PackedQ5::pack(&m).err().unwrap();
        assert!(err.to_string().contains("not q8_0"), "{err}");
        let mut w = vec![0u8; 8 * 22];
        w[..2].copy_from_slice(&f16::from_f32(10000.0).to_le_bytes());
        let m = QuantMatrix::new(QuantType::Q5_0, &w, 8, 32).unwrap();
        let err = PackedQ5::pack(&m).err().unwrap();
        assert!(err.to_string().contains("too large"), "{err}");
    }
}
