//! Q5_K weights repacked at load: packed Q4_K's super-block header (see
//! `packed_q4k`) over sub-blocks whose bits are a packed Q5 block's (see
//! `packed_q5`: the nibbles in the packed Q4 chunk layout, then a word of
//! fifth bits), 1440 bytes per group and super-block against 8 × 176 for
//! Q5_K, and the same products (see `packed_q4k`) with `q` in `0..=31`.

#[cfg(target_arch = "x86_64")]
use super::packed::GROUP_ROWS;
use super::packed_q4k::{PackedKQuant, SubBlockBits, SUB_BLOCKS};
use super::packed_q5::{five_bit_block_sum, place_values, BLOCK_BITS};
#[cfg(target_arch = "x86_64")]
use super::qact::Q16Row;
#[cfg(target_arch = "x86_64")]
use super::simd::amx::FullTiles;
#[cfg(target_arch = "x86_64")]
use super::simd::amx_kquant::RowTiles;
use crate::quant::{q5_k, QuantType};

/// Q5_K's sub-block bits: a packed Q5 block's nibbles and fifth bits.
pub(crate) struct FiveBits;

/// A Q5_K matrix repacked (see the module documentation).
pub(crate) type PackedQ5K = PackedKQuant<FiveBits>;

impl SubBlockBits for FiveBits {
    const QT: QuantType = QuantType::Q5K;
    const BLOCK_BITS: usize = BLOCK_BITS;

    fn pack_bits(b: &[u8], r: usize, bits: &mut [u8]) {
        let (qh, qs) = (&b[16..48], &b[48..q5_k::BLOCK_BYTES]);
        for j in 0..SUB_BLOCKS {
            let (bytes, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
            let q = std::array::from_fn(|l| ((bytes[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4));
            place_values(&mut bits[BLOCK_BITS * j..][..BLOCK_BITS], r, q);
        }
    }

    #[cfg(test)]
    fn value(bits: &[u8], r: usize, col: usize) -> u8 {
        super::packed_q5::value(bits, r, col)
    }

    fn block_sum<const SHIFT: u32>(bits: &[u8], r: usize, hi: &[i8], lo: &[i8]) -> i32 {
        five_bit_block_sum::<SHIFT>(bits, r, hi, lo)
    }

    super::packed::simd_group_products!(
        [const SHIFT: u32],
        Q16Row<'_, SHIFT>,
        avx2_packed_q5k,
        avx_vnni_packed::q5k,
        vnni_packed_q5k
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
        unsafe { super::simd::amx_kquant::q5k::pairs(tiles, groups, group_bytes, rows, out) }
    }
}
