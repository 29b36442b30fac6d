//! Q5_0: 32 values per 22-byte block, `[d: f16][qh: u32][qs: 16 bytes]`.
//! Byte `j` of `qs` holds the low four bits of value `j` (low nibble) and of
//! value `j + 16` (high nibble); bit `i` of the little-endian `qh` is the
//! fifth bit of value `i`. `x = d·(q − 16)`.

use super::{f16_at, to_f16};

/// Values per block.
pub(crate) const BLOCK_LEN: usize = 32;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: usize = 22;

/// The block's scale `d`.
#[inline(always)]
pub(crate) fn scale(b: &[u8; BLOCK_BYTES]) -> f32 {
    f16_at(b, 0)
}

/// The block's 32 five-bit values (0..=31) in value order, from the fifth
/// bits at `b[high..high + 4]` and the nibbles at `b[high + 4..]`.
#[inline(always)]
pub(crate) fn five_bits(b: &[u8], high: usize) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[high], b[high + 1], b[high + 2], b[high + 3]]);
    std::array::from_fn(|i| {
        let byte = b[high + 4 + i % 16];
        let low = if i < 16 { byte & 0x0F } else { byte >> 4 };
        low | ((((qh >> i) & 1) as u8) << 4)
    })
}

/// Packs 32 five-bit values (each at most 31) into `qh` at
/// `out[high..high + 4]` and the nibbles at `out[high + 4..high + 20]`.
pub(crate) fn pack_five_bits(q: &[u8; 32], out: &mut [u8], high: usize) {
    let mut qh = 0u32;
    for (i, &v) in q.iter().enumerate() {
        qh |= ((v as u32 >> 4) & 1) << i;
    }
    out[high..high + 4].copy_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        out[high + 4 + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
}

/// `out[i] = d · (q[i] − 16)`.
pub(crate) fn dequantize_block(b: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = scale(b);
    for (o, q) in out.iter_mut().zip(five_bits(b, 2)) {
        *o = d * (q as i32 - 16) as f32;
    }
}

/// `d = v / −16` with `v` the value of largest magnitude (so `v` maps to
/// 0), `q = min(31, ⌊x / d + 16.5⌋)`.
pub(crate) fn quantize_block(x: &[f32; BLOCK_LEN], out: &mut [u8; BLOCK_BYTES]) {
    let v = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = v / -16.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let (bytes, _) = to_f16(d);
    out[..2].copy_from_slice(&bytes);
    let q = x.map(|v| ((v * id + 16.5) as u8).min(31));
    pack_five_bits(&q, out, 2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_bit_packing_round_trips() {
        let q: [u8; 32] = std::array::from_fn(|i| (i as u8 * 7 + 3) % 32);
        let mut b = [0u8; BLOCK_BYTES];
        pack_five_bits(&q, &mut b, 2);
        assert_eq!(five_bits(&b, 2), q);
    }
}
