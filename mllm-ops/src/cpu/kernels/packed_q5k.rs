//! Q5_K weights repacked at load for the 16-bit-activation integer
//! kernels, and the linear layer over them.
//!
//! The super-block header is packed Q4_K's (see `packed_q4k`: the eight
//! rows' f16 `d` and `dmin`, then their unpacked 6-bit scales and minimums
//! sub-block after sub-block), and each sub-block's bits are a packed Q5
//! block's (see `packed_q5`: the nibbles in the packed Q4 chunk layout,
//! then a word of fifth bits), 1440 bytes per group and super-block
//! against 8 × 176 for Q5_K:
//!
//! ```text
//! [d: 8 × f16][dmin: 8 × f16][sc: 8 sub-blocks × 8 rows × u8]
//! [m: 8 sub-blocks × 8 rows × u8][bits: 8 sub-blocks × 160 bytes]
//! ```
//!
//! Sub-block `j` of row `r` contributes `(d·sc)·d_x·Σ q·q_x + (−dmin·m)·s_x`
//! with `q` in `0..=31`, the values Q5_K dequantizes to.

use mllm_core::Result;
use rayon::ThreadPool;

use super::packed::{
    check_packable, pack_blocks, wide_packed_linear, PackedData, PackedFormat, GROUP_ROWS,
};
pub(crate) use super::packed_q4k::SUB_BLOCKS;
use super::packed_q4k::{pack_header, sub_block_scales};
use super::packed_q5::{five_bit_block_sum, place_values, value};
use super::qact::{Q16Row, BLOCK, WIDE};
use super::qkernel::QuantKernel;
use super::qmatmul::QuantMatrix;
#[cfg(target_arch = "x86_64")]
use super::simd;
use crate::quant::{q5_k, QuantType};

/// Offset of the sub-blocks' bits (after the header, as in packed Q4_K).
pub(crate) const BITS_AT: usize = super::packed_q4k::BITS_AT;
/// Bytes of bits per group and sub-block (a packed Q5 block's).
pub(crate) const BLOCK_BITS: usize = super::packed_q5::BLOCK_BITS;
/// Bytes of one group per super-block.
pub(crate) const SUPER_BYTES: usize = BITS_AT + SUB_BLOCKS * BLOCK_BITS;

/// A Q5_K matrix `[rows, cols]` repacked in groups of eight rows (see the
/// module documentation).
pub struct PackedQ5K {
    data: PackedData,
}

impl PackedQ5K {
    /// Repacks `w`; fails when it is not Q5_K or when its row count is not
    /// a multiple of eight.
    pub fn pack(w: &QuantMatrix<'_>) -> Result<PackedQ5K> {
        let (rows, cols) = (w.rows(), w.cols());
        check_packable(w, &[QuantType::Q5K], "q5_k")?;
        let supers = cols / q5_k::BLOCK_LEN;
        let mut data = vec![0u8; rows / GROUP_ROWS * supers * SUPER_BYTES];
        pack_blocks(&mut data, SUPER_BYTES, supers, |g, s, out| {
            for r in 0..GROUP_ROWS {
                let row = w.row(g * GROUP_ROWS + r);
                let b = &row[s * q5_k::BLOCK_BYTES..(s + 1) * q5_k::BLOCK_BYTES];
                pack_row(b, r, out);
            }
            Ok(())
        })?;
        Ok(PackedQ5K {
            data: PackedData::owned(data, rows, cols, SUPER_BYTES / SUB_BLOCKS),
        })
    }

    /// Row `r`'s values from the packed bytes of its group (`d·sc·q −
    /// dmin·m`, the values Q5_K dequantizes to).
    pub fn unpack_row(group: &[u8], r: usize, out: &mut [f32]) {
        for (sb, out) in group
            .chunks_exact(SUPER_BYTES)
            .zip(out.chunks_exact_mut(q5_k::BLOCK_LEN))
        {
            for (j, out) in out.chunks_exact_mut(BLOCK).enumerate() {
                let bits = &sb[BITS_AT + BLOCK_BITS * j..][..BLOCK_BITS];
                let (d, m) = sub_block_scales(sb, r, j);
                for (col, o) in out.iter_mut().enumerate() {
                    *o = d * value(bits, r, col) as f32 + m;
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
}

/// Writes super-block `b` (176 bytes of Q5_K) as row `r` of a packed group
/// super-block `out`.
fn pack_row(b: &[u8], r: usize, out: &mut [u8]) {
    pack_header(b, r, out);
    let (qh, qs) = (&b[16..48], &b[48..q5_k::BLOCK_BYTES]);
    for j in 0..SUB_BLOCKS {
        let (bytes, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
        let q = std::array::from_fn(|l| ((bytes[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4));
        place_values(&mut out[BITS_AT + BLOCK_BITS * j..][..BLOCK_BITS], r, q);
    }
}

/// The packed Q5_K layout (see the module documentation).
pub(crate) struct Q5KFormat;

impl PackedFormat for Q5KFormat {
    type Input<'a> = Q16Row<'a, WIDE>;
    const BLOCK_BYTES: usize = SUPER_BYTES / SUB_BLOCKS;

    fn blocks(x: &Q16Row<'_, WIDE>) -> usize {
        x.d.len()
    }

    fn portable(group: &[u8], xs: &[Q16Row<'_, WIDE>], out: &mut [[f32; GROUP_ROWS]]) {
        group_dot(group, xs, out)
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2(group: &[u8], xs: &[Q16Row<'_, WIDE>], out: &mut [[f32; GROUP_ROWS]]) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { simd::avx2_packed_q5k::group_dot(group, xs, out) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni(group: &[u8], xs: &[Q16Row<'_, WIDE>], out: &mut [[f32; GROUP_ROWS]]) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { simd::vnni_packed_q5k::group_dot(group, xs, out) }
    }

    /// # Safety
    /// The trait method's: the CPU has the features it names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn vnni_pair(
        a: &[u8],
        b: &[u8],
        xs: &[Q16Row<'_, WIDE>],
        out: &mut [[f32; GROUP_ROWS]],
    ) {
        // SAFETY: the caller guarantees the features (trait contract).
        unsafe { simd::vnni_packed_q5k::pair_dot(a, b, xs, out) }
    }
}

/// The eight outputs of one packed group for each activation row of `xs`
/// (one to `TILE_TOKENS` rows), in portable code: per sub-block and row
/// `(d·sc)·d_x·Σ q_w q_x + (−dmin·m)·s_x`, accumulated in f32.
pub(crate) fn group_dot(group: &[u8], xs: &[Q16Row<'_, WIDE>], out: &mut [[f32; GROUP_ROWS]]) {
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        *out = [0.0; GROUP_ROWS];
        let mut xb =
            x.hi.chunks_exact(BLOCK)
                .zip(x.lo.chunks_exact(BLOCK))
                .zip(x.d.iter().zip(x.s));
        for sb in group.chunks_exact(SUPER_BYTES) {
            for j in 0..SUB_BLOCKS {
                let ((hi, lo), (&dx, &sx)) = xb.next().expect("one activation block per sub-block");
                let bits = &sb[BITS_AT + BLOCK_BITS * j..][..BLOCK_BITS];
                for (r, acc) in out.iter_mut().enumerate() {
                    let (d, m) = sub_block_scales(sb, r, j);
                    let sum = five_bit_block_sum(bits, r, hi, lo);
                    *acc += d * dx * sum as f32 + m * sx;
                }
            }
        }
    }
}

/// Linear layer over a packed Q5_K matrix: `y[t, o] = Σ_i x[t, i] ·
/// W[o, i] + bias[o]` with the activation rows quantized to 16 bits (two
/// 8-bit planes per block of 32 split at [`WIDE`]). `x` is
/// `[rows, w.cols()]`, `y` `[rows, w.rows()]`; parallel over row groups in
/// `pool` unless the work is tiny. Each row's result is independent of the
/// other rows and of the split over threads. Slice lengths are checked
/// with `debug_assert!`.
pub fn packed_q5k_linear(
    k: QuantKernel,
    x: &[f32],
    rows: usize,
    w: &PackedQ5K,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &ThreadPool,
) {
    wide_packed_linear::<Q5KFormat>(k, x, rows, &w.data, bias, y, pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::packed::tests::{
        check_group_products, check_packed_linear, check_rows_alone, check_unpacked_rows,
        BoundLinear,
    };
    use crate::cpu::kernels::packed::TILE_TOKENS;
    use crate::cpu::kernels::qact::Q16Act;
    use crate::cpu::kernels::qkernel::tests::random_blocks;
    use crate::cpu::kernels::qkernel::SimdLevel;
    use crate::cpu::kernels::test_util::Rng;

    const QT: QuantType = QuantType::Q5K;

    /// A Q5_K matrix of `rows` rows of `supers` random super-blocks.
    fn random_matrix(rng: &mut Rng, rows: usize, supers: usize) -> Vec<u8> {
        random_blocks(rng, QT, rows * supers)
    }

    /// Each row unpacked from the packed layout has exactly the values the
    /// Q5_K dequantizer gives the unpacked row.
    #[test]
    fn unpacked_rows_equal_the_dequantized_rows() {
        let mut rng = Rng::new(81);
        let (rows, supers) = (16, 3);
        let cols = supers * q5_k::BLOCK_LEN;
        let w = random_matrix(&mut rng, rows, supers);
        let p = PackedQ5K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let groups = |g| p.data.groups(g, 1);
        check_unpacked_rows(QT, &w, [rows, cols], &groups, PackedQ5K::unpack_row);
    }

    /// The packed Q5_K layer matches the f64 product of the dequantized
    /// weights at every level and thread count (see `check_packed_linear`),
    /// for one row (decode) and row counts that do and do not fill the
    /// token tile.
    #[test]
    fn packed_q5k_linear_matches_reference() {
        let mut rng = Rng::new(82);
        let cases = [
            (1, 8, 8),
            (1, 16, 72),
            (5, 24, 16),
            (70, 8, 24),
            (131, 8, 8),
        ];
        let blocks = |rng: &mut Rng, n: usize| random_blocks(rng, QT, n / SUB_BLOCKS);
        check_packed_linear(
            &mut rng,
            QT,
            &blocks,
            &cases,
            &|k, m, x, rows, b, y, pool| {
                packed_q5k_linear(k, x, rows, &PackedQ5K::pack(m).unwrap(), b, y, pool)
            },
        );
    }

    /// Batch invariance (see `check_rows_alone`).
    #[test]
    fn each_row_equals_the_row_alone() {
        let mut rng = Rng::new(83);
        for &(rows, supers, out_f) in &[(3, 1, 64), (6, 2, 40), (131, 1, 24)] {
            let in_f = supers * q5_k::BLOCK_LEN;
            let w = random_matrix(&mut rng, out_f, supers);
            let p = PackedQ5K::pack(&QuantMatrix::new(QT, &w, out_f, in_f).unwrap()).unwrap();
            let x = rng.vec(rows * in_f, 1.0);
            let b = rng.vec(out_f, 1.0);
            let linear: &BoundLinear<'_> =
                &|k, x, rows, y, pool| packed_q5k_linear(k, x, rows, &p, Some(&b), y, pool);
            check_rows_alone(linear, &x, rows, out_f, false, "q5_k");
        }
    }

    /// The AVX-512 VNNI group products equal the AVX2 ones bit for bit, for
    /// one group and two, and one to four rows.
    #[test]
    fn vnni_group_dot_equals_avx2() {
        let mut rng = Rng::new(84);
        let (rows, supers) = (2 * GROUP_ROWS, 2);
        let cols = supers * q5_k::BLOCK_LEN;
        let w = random_matrix(&mut rng, rows, supers);
        let p = PackedQ5K::pack(&QuantMatrix::new(QT, &w, rows, cols).unwrap()).unwrap();
        let acts: Vec<Q16Act<WIDE>> = (0..TILE_TOKENS)
            .map(|_| Q16Act::quantize(&rng.vec(cols, 3.0)))
            .collect();
        let xs: Vec<Q16Row<'_, WIDE>> = acts.iter().map(|a| a.row()).collect();
        let levels = [SimdLevel::Avx2, SimdLevel::Avx512];
        check_group_products::<Q5KFormat>(p.data.groups(0, 2), &xs, &levels, "q5_k");
    }

    #[test]
    fn what_cannot_be_packed_is_an_error() {
        let w = vec![0u8; 7 * q5_k::BLOCK_BYTES];
        let m = QuantMatrix::new(QT, &w, 7, q5_k::BLOCK_LEN).unwrap();
        let err = PackedQ5K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("7 rows"), "{err}");
        let w = vec![0u8; 8 * 144];
        let m = QuantMatrix::new(QuantType::Q4K, &w, 8, 256).unwrap();
        let err = PackedQ5K::pack(&m).err().unwrap();
        assert!(err.to_string().contains("not q4_k"), "{err}");
    }
}
