//! AVX2 product of a packed Q4_K row group (see `packed_q4k`) with one to
//! four 16-bit activation rows that have one scale per super-block: per
//! sub-block the packed Q4 block sums of `avx2_packed`, times the
//! sub-block's 6-bit scale and added up over the super-block as integers,
//! then one float step per super-block with `d`, `dmin` and the minimums'
//! integer sum (see `packed_q4k` for the formula every level shares).
//!
//! Every function here is a safe `#[target_feature]` function: callers must
//! only reach it after detecting AVX2, FMA and F16C (see `QuantKernel`).

use std::arch::x86_64::*;

use super::avx2::store;
use crate::cpu::kernels::packed::{GROUP_ROWS, TILE_TOKENS};
use crate::cpu::kernels::qact::{Q16Row, BYTE};

/// Defines `tile::<T>`, the eight outputs of one packed group for `T`
/// activation rows in a K-quant layout with packed Q4_K's super-block
/// header and the sub-block bits `$bits` (a `packed_q4k::SubBlockBits`
/// type), over a module's block
/// sums `$sums` of one sub-block's bits (as `avx2_packed::block_sums`).
/// The AVX2, AVX-VNNI and AVX-512 VNNI kernels of packed Q4_K (Q4
/// nibbles) and packed Q5_K (Q5 bits) share it.
///
/// Each sub-block's sums are weighted by its eight 6-bit scales as 32-bit
/// integers (`mullo` with [`u8x8`]), or, where a module's sums are still
/// 16-bit pair sums, given as `$sums, |bytes, consts| scales, $weigh` (as
/// the AVX2 Q4_K kernel does: [`scale_pairs`] with the tile's
/// `ByteConsts` and `madd`, one instruction that widens and weighs).
macro_rules! q4k_tile {
    ($features:literal, $sums:path, $bits:ty) => {
        $crate::cpu::kernels::simd::avx2_packed_q4k::q4k_tile!(
            $features,
            [
                $sums,
                |bytes, _consts| $crate::cpu::kernels::simd::avx2_packed_q4k::u8x8(bytes),
                _mm256_mullo_epi32
            ],
            $bits
        );
    };
    (
        $features:literal,
        [$sums:path, |$bytes:ident, $consts:ident| $scales:expr, $weigh:path],
        $bits:ty
    ) => {
        /// The eight outputs of one packed group for `T` activation rows.
        #[target_feature(enable = $features)]
        #[inline]
        fn tile<const T: usize, const SHIFT: u32>(
            group: &[u8],
            xs: &[Q16Row<'_, SHIFT>],
            reads: $crate::cpu::kernels::packed::WeightReads,
        ) -> [__m256; T] {
            use $crate::cpu::kernels::packed_q4k::{SubBlockBits, BITS_AT, SCALES_AT, SUB_BLOCKS};
            use $crate::cpu::kernels::simd::avx2_packed::{f16x8, ByteConsts, RowPlanes};
            use $crate::cpu::kernels::simd::avx2_packed_q4k::{add_super, super_mins};
            const BLOCK_BITS: usize = <$bits as SubBlockBits>::BLOCK_BITS;
            const SUPER_BYTES: usize = <$bits as SubBlockBits>::SUPER_BYTES;
            let xs: [Q16Row<'_, SHIFT>; T] = std::array::from_fn(|t| xs[t]);
            let nb = xs[0].d.len();
            let consts = ByteConsts::new();
            let planes = RowPlanes::new(xs, nb, consts);
            let mut acc = [_mm256_setzero_ps(); T];
            let supers = group[..nb / SUB_BLOCKS * SUPER_BYTES]
                .as_chunks::<SUPER_BYTES>()
                .0;
            let mut ahead = $crate::cpu::kernels::simd::prefetch::Streams::new(group, 1, reads);
            for (s, sb) in supers.iter().enumerate() {
                let mut sums_hi = [_mm256_setzero_si256(); T];
                let mut sums_lo = [_mm256_setzero_si256(); T];
                for j in 0..SUB_BLOCKS {
                    let i = s * SUB_BLOCKS + j;
                    let block_bytes = SUPER_BYTES / SUB_BLOCKS;
                    ahead.next(block_bytes);
                    let bits = &sb[BITS_AT + BLOCK_BITS * j..];
                    $crate::cpu::kernels::simd::prefetch::block_into_l1(bits, BLOCK_BITS);
                    let (sum_hi, sum_lo) = $sums(bits, planes.block(i));
                    let sc = {
                        let ($bytes, $consts) = (&sb[SCALES_AT + GROUP_ROWS * j..], consts);
                        $scales
                    };
                    for t in 0..T {
                        let scaled = $weigh(sum_hi[t], sc);
                        sums_hi[t] = _mm256_add_epi32(sums_hi[t], scaled);
                        if SHIFT != $crate::cpu::kernels::qact::BYTE {
                            let scaled = $weigh(sum_lo[t], sc);
                            sums_lo[t] = _mm256_add_epi32(sums_lo[t], scaled);
                        }
                    }
                }
                let d = f16x8(&sb[..16]);
                let neg_dmin = _mm256_xor_ps(f16x8(&sb[16..32]), _mm256_set1_ps(-0.0));
                let first = s * SUB_BLOCKS;
                for t in 0..T {
                    let mins = super_mins(sb, &xs[t].sums[first..first + SUB_BLOCKS]);
                    let sums = (sums_hi[t], sums_lo[t], mins);
                    acc[t] = add_super::<SHIFT>(acc[t], (d, neg_dmin), sums, xs[t].d[first]);
                }
            }
            acc
        }
    };
}

pub(crate) use q4k_tile;

super::avx2_packed::nibble_block_sums!(sixteen);

q4k_tile!(
    "avx2,fma,f16c",
    [
        block_sums16,
        |bytes, consts| scale_pairs(bytes, consts.scale_lanes),
        _mm256_madd_epi16
    ],
    crate::cpu::kernels::packed_q4k::Nibbles
);

/// The eight bytes at the start of `b` as 16-bit integers, each twice in
/// its row's 32-bit lane (`lanes` is [`ByteConsts::scale_lanes`], the
/// shuffle that places them): `madd` of a row's 16-bit pair sums with them
/// gives the pair's 32-bit sum times the row's byte, the integers that
/// `madd` with ones and then `mullo` gave, in one instruction instead of
/// two. On a Zen 3, with both builds running at once, one per core: the
/// 16-bit prefill of a 1.1B model's 8192 x 2048 Q4_K gate projection (128
/// rows) 1.00-1.15x as fast (four rounds; 8-bit rows 1.02-1.09x), the
/// one-row product in L2 0.90-1.21x (median 1.06x, six rounds); the 1.1B
/// Q4_K_M's decode moved within the noise.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn scale_pairs(b: &[u8], lanes: __m256i) -> __m256i {
    let bytes: [u8; 8] = b[..8].try_into().expect("eight bytes");
    _mm256_shuffle_epi8(_mm256_set1_epi64x(i64::from_le_bytes(bytes)), lanes)
}

/// The eight bytes at the start of `b` as 32-bit integers.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn u8x8(b: &[u8]) -> __m256i {
    let bytes: [u8; 8] = b[..8].try_into().expect("eight bytes");
    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(bytes)))
}

/// The eight rows' `Σ_j m_j·Σq_x` over a packed super-block `sb` (the
/// minimums in its header) and one activation row's exact block sums
/// `sums` (one per sub-block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn super_mins(sb: &[u8], sums: &[i32]) -> __m256i {
    use crate::cpu::kernels::packed_q4k::MINS_AT;
    sums.iter()
        .enumerate()
        .fold(_mm256_setzero_si256(), |acc, (j, &sum)| {
            let m = u8x8(&sb[MINS_AT + GROUP_ROWS * j..]);
            _mm256_add_epi32(acc, _mm256_mullo_epi32(m, _mm256_set1_epi32(sum)))
        })
}

/// Adds one super-block to the eight rows' outputs `acc`: with the rows'
/// `d` and `−dmin`, the integer sums `Σ sc·q·hi`, `Σ sc·q·lo` (of rows
/// split at `SHIFT`) and `Σ m·q_x`, and the activation scale `dx`,
/// `fma(2^SHIFT·hi + lo, d·dx, acc)` then `fma(mins, −dmin·dx, ·)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn add_super<const SHIFT: u32>(
    acc: __m256,
    (d, neg_dmin): (__m256, __m256),
    (hi, lo, mins): (__m256i, __m256i, __m256i),
    dx: f32,
) -> __m256 {
    let dx = _mm256_set1_ps(dx);
    let acc = _mm256_fmadd_ps(plane_sum::<SHIFT>(hi, lo), _mm256_mul_ps(d, dx), acc);
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(neg_dmin, dx), acc)
}

/// `2^SHIFT·hi + lo` of a super-block's integer plane sums (of rows split
/// at `SHIFT`; `hi` alone for `BYTE` rows) as f32: one `fma` of the
/// converted sums, the same at every level.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn plane_sum<const SHIFT: u32>(hi: __m256i, lo: __m256i) -> __m256 {
    let hi = _mm256_cvtepi32_ps(hi);
    if SHIFT == BYTE {
        hi
    } else {
        let step = _mm256_set1_ps((1u32 << SHIFT) as f32);
        _mm256_fmadd_ps(hi, step, _mm256_cvtepi32_ps(lo))
    }
}

super::avx2_packed::packed_group_dot!("avx2,fma,f16c", [const SHIFT: u32], Q16Row<'_, SHIFT>);
