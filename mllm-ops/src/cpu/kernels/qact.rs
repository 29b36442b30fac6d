//! 8-bit activations for the integer path: an activation row quantized per
//! block of 32 (like ggml's Q8_1, with an f32 scale), and the scalar integer
//! dot products of Q8_0, Q4_0 and Q4_1 weight rows with them.

use std::sync::Mutex;

use mllm_core::LineBuffer;

use super::CACHE_LINE as LINE;
use crate::quant::{q4_0, q4_1, q8_0, QuantType};

/// Values per activation block (the block length of the weight formats).
pub(crate) const BLOCK: usize = 32;

/// Values per scale of the activation rows that K-quant weights take: one
/// scale per super-block of 256, so that a super-block's sub-block sums
/// add up as integers before one float step (see `packed_q4k`).
pub(crate) const SUPER_BLOCK: usize = 256;

/// The weight formats with an integer dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int8Type {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl Int8Type {
    /// The integer-path format for `qt`, if it has one.
    pub(crate) fn from_quant(qt: QuantType) -> Option<Int8Type> {
        match qt {
            QuantType::Q8_0 => Some(Int8Type::Q8_0),
            QuantType::Q4_0 => Some(Int8Type::Q4_0),
            QuantType::Q4_1 => Some(Int8Type::Q4_1),
            QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::Q2K
            | QuantType::Q3K
            | QuantType::IQ4NL
            | QuantType::IQ4XS => None,
        }
    }
}

/// An activation row quantized to 8 bits: per block of 32 values a scale
/// `d = amax / 127`, the values `q = round(x / d)` (half to even) in
/// `−127..=127`, and
/// `s = d · Σq` (used by Q4_1's offset term).
pub(crate) struct Q8Act {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// A borrowed [`Q8Act`].
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    /// The 8-bit values.
    pub q: &'a [i8],
    /// One scale per block.
    pub d: &'a [f32],
    /// `d · Σq` per block.
    pub s: &'a [f32],
}

impl Q8Act {
    /// An all-zero row of `len` values (a multiple of 32).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn zeros(len: usize) -> Q8Act {
        Q8Act {
            q: vec![0; len],
            d: vec![0.0; len / BLOCK],
            s: vec![0.0; len / BLOCK],
        }
    }

    /// The parts, to be filled by a SIMD quantizer.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn parts_mut(&mut self) -> (&mut [i8], &mut [f32], &mut [f32]) {
        (&mut self.q, &mut self.d, &mut self.s)
    }

    /// Quantizes `x` (its length a multiple of 32).
    pub(crate) fn quantize(x: &[f32]) -> Q8Act {
        debug_assert!(x.len().is_multiple_of(BLOCK));
        let blocks = x.len() / BLOCK;
        let mut out = Q8Act {
            q: vec![0; x.len()],
            d: Vec::with_capacity(blocks),
            s: Vec::with_capacity(blocks),
        };
        for (xb, qb) in x.chunks_exact(BLOCK).zip(out.q.chunks_exact_mut(BLOCK)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
                sum += *q as i32;
            }
            out.d.push(d);
            out.s.push(d * sum as f32);
        }
        out
    }

    /// The quantized row.
    pub(crate) fn row(&self) -> Q8Row<'_> {
        Q8Row {
            q: &self.q,
            d: &self.d,
            s: &self.s,
        }
    }
}

/// `Σ_j w[j]·x[j]` over one block, exactly.
#[inline(always)]
fn isum<T: Copy + Into<i32>>(w: [T; BLOCK], x: &[i8; BLOCK]) -> i32 {
    w.iter().zip(x).map(|(&a, &b)| a.into() * b as i32).sum()
}

/// The dot product of a weight row of `it` blocks with a quantized
/// activation row: per block `(d_w·d_x)·Σ q_w q_x` (Q4_0 with `q_w − 8`),
/// plus `m·s_x` for Q4_1, accumulated in f32 block by block.
pub(crate) fn dot_i8(it: Int8Type, w: &[u8], x: Q8Row<'_>) -> f32 {
    let xs = x.q.as_chunks::<BLOCK>().0.iter().zip(x.d.iter().zip(x.s));
    let mut acc = 0.0f32;
    match it {
        Int8Type::Q8_0 => {
            for (b, (xq, (&dx, _))) in w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let p = isum(q8_0::quants(b), xq);
                acc += q8_0::scale(b) * dx * p as f32;
            }
        }
        Int8Type::Q4_0 => {
            for (b, (xq, (&dx, _))) in w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0.iter().zip(xs) {
                let p = isum(q4_0::nibbles(b).map(|q| q as i8 - 8), xq);
                acc += q4_0::scale(b) * dx * p as f32;
            }
        }
        Int8Type::Q4_1 => {
            for (b, (xq, (&dx, &sx))) in w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0.iter().zip(xs) {
                let (d, m) = q4_1::scale_min(b);
                let p = isum(q4_1::nibbles(b), xq);
                acc += d * dx * p as f32 + m * sx;
            }
        }
    }
    acc
}

/// Largest magnitude of a 16-bit activation value, `127 · 128`, so that
/// its high part `q >> 7` fits in `−127..=127`.
pub(crate) const Q16_MAX: f32 = 16256.0;

/// Largest magnitude of a wide 16-bit activation value ([`WIDE`] planes),
/// `127 · 256 + 127`: both planes stay in `−127..=127` / `−128..=127`.
pub(crate) const Q16_WIDE_MAX: f32 = 32639.0;

/// The plane split of the row-by-row integer kernels: `q = 128·hi + lo`
/// with `lo` in `0..=127` (their sign tricks need `lo ≠ −128`).
pub(crate) const NARROW: u32 = 7;

/// The plane split of the packed kernel: `q = 256·hi + lo` with `lo` in
/// `−128..=127`, twice the resolution of [`NARROW`].
pub(crate) const WIDE: u32 = 8;

/// No split: 8-bit values in `−127..=127`, `hi = q` and `lo = 0` (the
/// packed 4-, 5- and 6-bit kernels then skip the low plane's products; see
/// `QuantPath::Int8Packed`). 1/256 of [`WIDE`]'s resolution.
pub(crate) const BYTE: u32 = 0;

/// An activation row quantized to 16 bits and stored as two 8-bit planes
/// for the byte dot-product instructions: per run of values that share a
/// scale (a block of 32, or [`SUPER_BLOCK`] for K-quant weights)
/// `d = amax / max`, `q = round(x / d)` (half to even) in `−max..=max`,
/// split as `q = 2^SHIFT·hi + lo`, and per block of 32 the scale `d`, the
/// exact sum `Σq` and `s = d · Σq`. With [`NARROW`], `max` is
/// [`Q16_MAX`], `hi = q >> 7` in `−127..=127` and `lo = q & 127`; with
/// [`WIDE`], `max` is [`Q16_WIDE_MAX`], `hi = (q + 128) >> 8` and
/// `lo = q − 256·hi` in `−128..=127`; with [`BYTE`], `max` is 127,
/// `hi = q` and `lo = 0`. Its rounding error is 1/128 ([`NARROW`]) or
/// 1/256 ([`WIDE`]) of [`Q8Act`]'s, and [`Q8Act`]'s with [`BYTE`].
///
/// Both planes live in one buffer, the low one [`LO_PLANE_SKEW`] bytes
/// after the end of the high one (see there).
pub(crate) struct Q16Act<const SHIFT: u32 = NARROW> {
    /// The high plane (`rows · stride` bytes), [`LO_PLANE_SKEW`] bytes of
    /// gap, the low plane (as long as the high one), from a cache line on:
    /// with the stride a whole number of lines, each 64-byte run of a row
    /// that an AMX tile load reads is one line, not two (half the time
    /// from L2).
    planes: LineBuffer<i8>,
    /// Rows.
    rows: usize,
    /// Values per row.
    width: usize,
    /// Bytes from one row's values to the next row's in each plane.
    stride: usize,
    d: Vec<f32>,
    s: Vec<f32>,
    sums: Vec<i32>,
}

/// A borrowed [`Q16Act`].
#[derive(Clone, Copy)]
pub(crate) struct Q16Row<'a, const SHIFT: u32 = NARROW> {
    /// High planes.
    pub hi: &'a [i8],
    /// Low planes.
    pub lo: &'a [i8],
    /// One scale per block.
    pub d: &'a [f32],
    /// `d · Σq` per block.
    pub s: &'a [f32],
    /// `Σq` per block, exactly.
    pub sums: &'a [i32],
}

/// Largest `|q|` for a plane split.
pub(crate) const fn q16_max(shift: u32) -> f32 {
    match shift {
        WIDE => Q16_WIDE_MAX,
        BYTE => 127.0,
        _ => Q16_MAX,
    }
}

/// The scale `d` of values whose largest magnitude is `amax`, quantized
/// for the plane split `SHIFT`, and its inverse (zero for an all-zero
/// scale): every level's quantizer of 16-bit rows takes both from here,
/// so that their values agree bit for bit.
#[inline(always)]
pub(crate) fn q16_scale<const SHIFT: u32>(amax: f32) -> (f32, f32) {
    let d = amax / q16_max(SHIFT);
    (d, if d == 0.0 { 0.0 } else { 1.0 / d })
}

/// Splits a 16-bit value into its planes `(hi, lo)`.
fn split<const SHIFT: u32>(q: i32) -> (i8, i8) {
    let round = if SHIFT == WIDE { 128 } else { 0 };
    let hi = (q + round) >> SHIFT;
    (hi as i8, (q - (hi << SHIFT)) as i8)
}

/// Bytes between the end of the high plane and the start of the low one:
/// half a 4 KiB page and a cache line, so that the low plane's rows start
/// in other L1 sets than the high plane's. A kernel reads the same block
/// of both planes of up to four rows side by side; with rows a multiple
/// of 4 KiB long (a 1.1B model's FFN down projection, 8192 wide) and the
/// planes in separate page-aligned buffers, all eight reads fell in one
/// set of an 8-way L1 and the AVX2 Q4_K kernel with 16-bit rows ran that
/// projection 17 % slower than the gate's (criterion `q4k_prefill_1b`).
const LO_PLANE_SKEW: usize = 2048 + 64;

/// Bytes from one row's values to the next row's in the planes of a block
/// of rows `width` values wide: an odd number of cache lines, so that the
/// same block of 16 consecutive rows (an AMX tile's operand, read in
/// place) lies in 16 different L1 sets. Rows packed back to back put all
/// 16 in one set of a 12-way L1 when they are a multiple of 4 KiB long,
/// and in two when they are 2048 wide. With the odd stride, one thread's
/// AMX kernels over 128 rows 8192 wide ran 4-7 % faster (Q4_K, 8- and
/// 16-bit rows), and over rows 2048 wide the Q8_0 one with 16-bit rows
/// ran 5-8 % faster; the other kernels moved within ±4 %.
pub(crate) fn row_stride(width: usize) -> usize {
    (width.div_ceil(LINE) | 1) * LINE
}

/// The buffers of a [`Q16Act`], kept between quantizations (see
/// [`ActivationScratch`]): they may be longer than a row needs, and
/// hold the values of an earlier row until a quantizer overwrites them.
#[derive(Default)]
pub(crate) struct Q16Buffers {
    planes: LineBuffer<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    sums: Vec<i32>,
}

/// Buffers for the quantized activations of linear calls, kept from one
/// call to the next so that a call neither allocates nor clears them
/// (clearing them was a serial pass over both planes before every 128-row
/// block). Share one among layers that run one after another, as a
/// backend's linear ops do: a call that finds it taken by another
/// (concurrent) call uses buffers of its own.
#[derive(Default)]
pub struct ActivationScratch {
    spare: Mutex<Q16Buffers>,
}

impl ActivationScratch {
    /// The spare buffers, or empty ones while another call holds them.
    pub(crate) fn take(&self) -> Q16Buffers {
        match self.spare.try_lock() {
            Ok(mut spare) => std::mem::take(&mut *spare),
            Err(_) => Q16Buffers::default(),
        }
    }

    /// Keeps `buffers` for the next call, unless another call is putting
    /// its own back.
    pub(crate) fn put(&self, buffers: Q16Buffers) {
        if let Ok(mut spare) = self.spare.try_lock() {
            *spare = buffers;
        }
    }
}

/// Grows `v` to at least `n` elements; what it holds stays.
fn at_least<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

impl<const SHIFT: u32> Q16Act<SHIFT> {
    /// An all-zero row of `len` values (a multiple of 32).
    pub(crate) fn zeros(len: usize) -> Self {
        Self::in_buffers(len, Q16Buffers::default())
    }

    /// A row of `len` values (a multiple of 32) in `buffers`, grown where
    /// they are too short: its values are whatever they held (zero where
    /// they grew) until a quantizer fills [`Self::parts_mut`].
    pub(crate) fn in_buffers(len: usize, buffers: Q16Buffers) -> Self {
        Self::rows_in_buffers(1, len, buffers)
    }

    /// [`Self::in_buffers`] for `rows` rows of `width` values each (a
    /// multiple of 32), one [`row_stride`] apart when there are several.
    pub(crate) fn rows_in_buffers(rows: usize, width: usize, mut buffers: Q16Buffers) -> Self {
        let stride = if rows > 1 { row_stride(width) } else { width };
        let blocks = rows * width / BLOCK;
        buffers.planes.grow_to(2 * rows * stride + LO_PLANE_SKEW);
        at_least(&mut buffers.d, blocks);
        at_least(&mut buffers.s, blocks);
        at_least(&mut buffers.sums, blocks);
        let Q16Buffers { planes, d, s, sums } = buffers;
        Q16Act {
            planes,
            rows,
            width,
            stride,
            d,
            s,
            sums,
        }
    }

    /// The buffers, for another row.
    pub(crate) fn into_buffers(self) -> Q16Buffers {
        let Q16Act {
            planes, d, s, sums, ..
        } = self;
        Q16Buffers { planes, d, s, sums }
    }

    /// The parts (the planes and the block scales), to be filled by a
    /// quantizer.
    pub(crate) fn parts_mut(&mut self) -> (&mut [i8], &mut [i8], BlockScales<'_>) {
        let (len, nb) = (self.plane_len(), self.rows * self.width / BLOCK);
        let (hi, rest) = self.planes.split_at_mut(len);
        let lo = &mut rest[LO_PLANE_SKEW..LO_PLANE_SKEW + len];
        let scales = BlockScales {
            d: &mut self.d[..nb],
            s: &mut self.s[..nb],
            sums: &mut self.sums[..nb],
        };
        (hi, lo, scales)
    }

    /// Quantizes `x` (its length a multiple of 32), one scale per block.
    #[cfg(test)]
    pub(crate) fn quantize(x: &[f32]) -> Self {
        Self::quantize_per(x, BLOCK)
    }

    /// Quantizes `x` with one scale per `per_scale` values (a multiple of
    /// 32 that divides the length).
    #[cfg(test)]
    pub(crate) fn quantize_per(x: &[f32], per_scale: usize) -> Self {
        let mut out = Self::zeros(x.len());
        let (hi, lo, scales) = out.parts_mut();
        quantize_q16_into::<SHIFT>(x, hi, lo, scales, per_scale);
        out
    }

    /// Bytes from one row's values to the next row's (see
    /// [`Self::rows_in_buffers`]).
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Bytes of each plane.
    fn plane_len(&self) -> usize {
        self.rows * self.stride
    }

    /// The quantized row (of a single-row activation).
    pub(crate) fn row(&self) -> Q16Row<'_, SHIFT> {
        debug_assert_eq!(self.rows, 1, "one row");
        self.row_at(0)
    }

    /// The quantized rows.
    pub(crate) fn rows(&self) -> Vec<Q16Row<'_, SHIFT>> {
        (0..self.rows).map(|r| self.row_at(r)).collect()
    }

    /// Row `r`.
    fn row_at(&self, r: usize) -> Q16Row<'_, SHIFT> {
        let (at, nb) = (r * self.stride, self.width / BLOCK);
        let lo_at = self.plane_len() + LO_PLANE_SKEW + at;
        Q16Row {
            hi: &self.planes[at..][..self.width],
            lo: &self.planes[lo_at..][..self.width],
            d: &self.d[r * nb..][..nb],
            s: &self.s[r * nb..][..nb],
            sums: &self.sums[r * nb..][..nb],
        }
    }
}

/// The per-block parts of a [`Q16Act`] that a quantizer fills: for each
/// block of 32 values its scale, `d · Σq` and `Σq`.
pub(crate) struct BlockScales<'a> {
    /// The scale of each block.
    pub d: &'a mut [f32],
    /// `d · Σq` of each block.
    pub s: &'a mut [f32],
    /// `Σq` of each block.
    pub sums: &'a mut [i32],
}

impl BlockScales<'_> {
    /// Sets block `b`'s scale `d` and sum `Σq`.
    #[inline(always)]
    pub(crate) fn set(&mut self, b: usize, d: f32, sum: i32) {
        self.d[b] = d;
        self.s[b] = d * sum as f32;
        self.sums[b] = sum;
    }
}

/// Quantizes `x` into the parts of a [`Q16Act`] (see there), sized for
/// it, with one scale per `per_scale` values (a multiple of 32 that
/// divides the length of `x`).
pub(crate) fn quantize_q16_into<const SHIFT: u32>(
    x: &[f32],
    hi: &mut [i8],
    lo: &mut [i8],
    mut scales: BlockScales<'_>,
    per_scale: usize,
) {
    debug_assert!(per_scale.is_multiple_of(BLOCK) && x.len().is_multiple_of(per_scale));
    let max = q16_max(SHIFT);
    for (c, xc) in x.chunks_exact(per_scale).enumerate() {
        let amax = xc.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (dc, id) = q16_scale::<SHIFT>(amax);
        for (i, xb) in xc.chunks_exact(BLOCK).enumerate() {
            let b = c * per_scale / BLOCK + i;
            let mut sum = 0i32;
            for (j, &v) in xb.iter().enumerate() {
                let q = (v * id).round_ties_even().clamp(-max, max) as i32;
                (hi[b * BLOCK + j], lo[b * BLOCK + j]) = split::<SHIFT>(q);
                sum += q;
            }
            scales.set(b, dc, sum);
        }
    }
}

impl<'a, const SHIFT: u32> Q16Row<'a, SHIFT> {
    /// The 16-bit value at `i`.
    #[cfg(test)]
    pub(crate) fn value(&self, i: usize) -> i32 {
        ((self.hi[i] as i32) << SHIFT) + self.lo[i] as i32
    }

    /// Values `r·len..(r + 1)·len` (a whole number of blocks) of a row
    /// holding several rows of `len` values.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn sub_row(&self, r: usize, len: usize) -> Q16Row<'a, SHIFT> {
        let nb = len / BLOCK;
        Q16Row {
            hi: &self.hi[r * len..(r + 1) * len],
            lo: &self.lo[r * len..(r + 1) * len],
            d: &self.d[r * nb..(r + 1) * nb],
            s: &self.s[r * nb..(r + 1) * nb],
            sums: &self.sums[r * nb..(r + 1) * nb],
        }
    }
}

/// `Σ_j w[j]·q[j]` over one block of a [`Q16Row`], exactly.
#[inline(always)]
fn isum16<T: Copy + Into<i32>>(w: [T; BLOCK], hi: &[i8; BLOCK], lo: &[i8; BLOCK]) -> i32 {
    128 * isum(w, hi) + isum(w, lo)
}

/// As [`dot_i8`] for 16-bit activations: per block `(d_w·d_x)·Σ q_w q_x`
/// (Q4_0 with `q_w − 8`), plus `m·s_x` for Q4_1.
pub(crate) fn dot_i16(it: Int8Type, w: &[u8], x: Q16Row<'_>) -> f32 {
    let his = x.hi.as_chunks::<BLOCK>().0.iter();
    let los = x.lo.as_chunks::<BLOCK>().0.iter();
    let xs = his.zip(los).zip(x.d.iter().zip(x.s));
    let mut acc = 0.0f32;
    match it {
        Int8Type::Q8_0 => {
            for (b, ((hi, lo), (&dx, _))) in w.as_chunks::<{ q8_0::BLOCK_BYTES }>().0.iter().zip(xs)
            {
                acc += q8_0::scale(b) * dx * isum16(q8_0::quants(b), hi, lo) as f32;
            }
        }
        Int8Type::Q4_0 => {
            for (b, ((hi, lo), (&dx, _))) in w.as_chunks::<{ q4_0::BLOCK_BYTES }>().0.iter().zip(xs)
            {
                let p = isum16(q4_0::nibbles(b).map(|q| q as i8 - 8), hi, lo);
                acc += q4_0::scale(b) * dx * p as f32;
            }
        }
        Int8Type::Q4_1 => {
            for (b, ((hi, lo), (&dx, &sx))) in
                w.as_chunks::<{ q4_1::BLOCK_BYTES }>().0.iter().zip(xs)
            {
                let (d, m) = q4_1::scale_min(b);
                acc += d * dx * isum16(q4_1::nibbles(b), hi, lo) as f32 + m * sx;
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::Rng;
    use crate::quant::{dequantize, quantize};

    /// The rows of a block lie an odd number of cache lines apart, so the
    /// same block of 16 consecutive rows falls in 16 different L1 sets,
    /// whatever the width; a single row keeps its width.
    #[test]
    fn block_rows_lie_an_odd_number_of_lines_apart() {
        let want = [
            (576, 576),
            (1536, 1600),
            (2048, 2112),
            (8192, 8256),
            (32, 64),
        ];
        for (width, stride) in want {
            assert_eq!(row_stride(width), stride, "width {width}");
            let act = Q16Act::<WIDE>::rows_in_buffers(16, width, Q16Buffers::default());
            let rows = act.rows();
            assert_eq!(rows.len(), 16);
            let mut sets: Vec<usize> = rows
                .iter()
                .map(|r| (r.hi[width - BLOCK..].as_ptr() as usize / LINE) % 64)
                .collect();
            sets.sort_unstable();
            sets.dedup();
            assert_eq!(sets.len(), 16, "width {width}: one L1 set per row");
            for (t, r) in rows.iter().enumerate() {
                let at = |p: &[i8]| p.as_ptr() as usize - rows[0].hi.as_ptr() as usize;
                assert_eq!(
                    (at(r.hi), r.hi.len(), r.lo.len()),
                    (t * stride, width, width)
                );
                assert_eq!(at(r.lo) - at(r.hi), 16 * stride + LO_PLANE_SKEW);
                assert_eq!((r.d.len(), r.s.len()), (width / BLOCK, width / BLOCK));
            }
        }
        let one = Q16Act::<WIDE>::rows_in_buffers(1, 2048, Q16Buffers::default());
        assert_eq!(one.stride(), 2048);
    }

    /// Every row's planes start on a cache line, also in buffers kept
    /// from a call of another shape, and a quantizer's values land in the
    /// rows.
    #[test]
    fn rows_start_on_cache_lines() {
        let mut buffers = Q16Buffers::default();
        for (rows, width) in [(1, 576), (1, 2048), (3, 96), (16, 576), (16, 2048), (2, 32)] {
            let mut act = Q16Act::<WIDE>::rows_in_buffers(rows, width, buffers);
            let (hi, lo, _) = act.parts_mut();
            hi.fill(1);
            lo.fill(2);
            for r in act.rows() {
                let line = |p: &[i8]| p.as_ptr() as usize % LINE;
                assert_eq!((line(r.hi), line(r.lo)), (0, 0), "{rows}x{width}");
                assert!(r.hi.iter().all(|&v| v == 1) && r.lo.iter().all(|&v| v == 2));
            }
            buffers = act.into_buffers();
        }
    }

    /// Rows a multiple of 4 KiB long: the low plane's rows start half a
    /// page and a line away from the high plane's (other L1 sets), and
    /// the planes keep what the quantizer wrote.
    #[test]
    fn low_plane_rows_start_in_other_l1_sets() {
        let (rows, width) = (4, 8192);
        let x = Rng::new(7).vec(rows * width, 2.0);
        let act = Q16Act::<WIDE>::quantize(&x);
        let r = act.row();
        assert_eq!((r.hi.len(), r.lo.len()), (rows * width, rows * width));
        let gap = r.lo.as_ptr() as usize - r.hi.as_ptr() as usize;
        assert_eq!(gap % 4096, LO_PLANE_SKEW % 4096);
        assert_ne!(gap % 4096, 0);
        let mut hi = vec![0; rows * width];
        let mut lo = vec![0; rows * width];
        let nb = rows * width / BLOCK;
        let (mut d, mut s, mut sums) = (vec![0.0; nb], vec![0.0; nb], vec![0; nb]);
        let scales = BlockScales {
            d: &mut d,
            s: &mut s,
            sums: &mut sums,
        };
        quantize_q16_into::<WIDE>(&x, &mut hi, &mut lo, scales, BLOCK);
        assert_eq!((r.hi, r.lo, r.d, r.s), (&hi[..], &lo[..], &d[..], &s[..]));
        assert_eq!(r.sums, &sums[..]);
    }

    #[test]
    fn activation_quantization_is_close() {
        let mut rng = Rng::new(5);
        let x = rng.vec(96, 2.0);
        let q = Q8Act::quantize(&x);
        let r = q.row();
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / BLOCK];
            assert!((r.q[i] as f32 * d - v).abs() <= 0.5 * d * 1.0001);
        }
        for b in 0..3 {
            let sum: i32 = r.q[b * 32..b * 32 + 32].iter().map(|&v| v as i32).sum();
            assert_eq!(r.s[b], r.d[b] * sum as f32);
        }
        let zero = Q8Act::quantize(&[0.0; 32]);
        assert_eq!(zero.row().d, [0.0]);
        assert!(zero.row().q.iter().all(|&v| v == 0));
    }

    /// 16-bit activations: each value within half a step of `x`, the planes
    /// in range, and the 16-bit dot within `1e-4 · Σ|w·x|` of the f64 dot of
    /// the dequantized weights with the original f32 activations (an 8-bit
    /// row is 128 times coarser).
    #[test]
    fn q16_activations_and_dot() {
        let mut rng = Rng::new(7);
        let x = rng.vec(32 * 7, 2.0);
        let q = Q16Act::<NARROW>::quantize(&x);
        let r = q.row();
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / BLOCK];
            assert!((0..=127).contains(&r.lo[i]) && r.hi[i] >= -127);
            let back = r.value(i) as f32 * d;
            assert!((back - v).abs() <= 0.5 * d * 1.0001, "{i}: {back} vs {v}");
        }
        for it in [Int8Type::Q8_0, Int8Type::Q4_0, Int8Type::Q4_1] {
            let qt = match it {
                Int8Type::Q8_0 => QuantType::Q8_0,
                Int8Type::Q4_0 => QuantType::Q4_0,
                Int8Type::Q4_1 => QuantType::Q4_1,
            };
            let w = quantize(qt.dtype(), &rng.vec(x.len(), 1.0)).unwrap();
            let mut wf = vec![0.0; x.len()];
            dequantize(qt.dtype(), &w, &mut wf).unwrap();
            let want: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wf
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let got = dot_i16(it, &w, r) as f64;
            assert!((got - want).abs() <= 1e-4 * mag, "{it:?}: {got} vs {want}");
        }
    }

    /// Wide 16-bit activations: each value within half a step of `x`, the
    /// planes in range (the block's largest magnitude reaches `±32639`,
    /// `hi = ±127`), and a scale twice as fine as the narrow split's.
    #[test]
    fn wide_q16_activations() {
        let mut rng = Rng::new(8);
        let mut x = rng.vec(32 * 5, 2.0);
        x[3] = 7.5;
        x[40] = -7.5;
        let (wide, narrow) = (Q16Act::<WIDE>::quantize(&x), Q16Act::<NARROW>::quantize(&x));
        let (r, n) = (wide.row(), narrow.row());
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / BLOCK];
            assert!((-127..=127).contains(&r.hi[i]), "{i}: hi {}", r.hi[i]);
            let back = r.value(i) as f32 * d;
            assert!((back - v).abs() <= 0.5 * d * 1.0001, "{i}: {back} vs {v}");
        }
        assert_eq!((r.value(3), r.value(40)), (32639, -32639));
        assert_eq!(
            (r.hi[3], r.lo[3], r.hi[40], r.lo[40]),
            (127, 127, -127, -127)
        );
        for b in 0..5 {
            assert!((r.d[b] * Q16_WIDE_MAX - n.d[b] * Q16_MAX).abs() <= 1e-6 * n.d[b] * Q16_MAX);
            let sum: i32 = (b * BLOCK..(b + 1) * BLOCK).map(|i| r.value(i)).sum();
            assert_eq!(r.s[b], r.d[b] * sum as f32);
        }
        assert!(r.lo.iter().any(|&l| l < 0), "the low plane is signed");
    }

    /// One scale per super-block: every block of a super-block has the
    /// scale of its largest magnitude over all 256 values, each value
    /// lies within half a step of `x`, and each block has its exact sum
    /// `Σq` (and `s = d·Σq`).
    #[test]
    fn one_scale_per_super_block() {
        let mut rng = Rng::new(10);
        let mut x = rng.vec(2 * SUPER_BLOCK, 2.0);
        x[300] = 9.0;
        let act = Q16Act::<WIDE>::quantize_per(&x, SUPER_BLOCK);
        let r = act.row();
        for (s, xs) in x.chunks_exact(SUPER_BLOCK).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let blocks = s * SUPER_BLOCK / BLOCK..(s + 1) * SUPER_BLOCK / BLOCK;
            assert!(r.d[blocks.clone()]
                .iter()
                .all(|&d| d == amax / Q16_WIDE_MAX));
            for b in blocks {
                let sum: i32 = (b * BLOCK..(b + 1) * BLOCK).map(|i| r.value(i)).sum();
                assert_eq!((r.sums[b], r.s[b]), (sum, r.d[b] * sum as f32));
            }
        }
        assert_eq!(r.value(300), 32639);
        for (i, &v) in x.iter().enumerate() {
            let d = r.d[i / BLOCK];
            assert!((r.value(i) as f32 * d - v).abs() <= 0.5 * d * 1.0001, "{i}");
        }
    }

    /// The single-plane split is the 8-bit row of [`Q8Act`]: the same
    /// values in `hi`, scales and sums, and a zero low plane.
    #[test]
    fn byte_activations_are_the_8_bit_row() {
        let mut rng = Rng::new(9);
        let mut x = rng.vec(32 * 6, 2.0);
        x[70] = -9.0;
        x[100..132].fill(0.0);
        let (byte, q8) = (Q16Act::<BYTE>::quantize(&x), Q8Act::quantize(&x));
        let (r, e) = (byte.row(), q8.row());
        assert_eq!(r.hi, e.q);
        assert!(r.lo.iter().all(|&l| l == 0));
        assert_eq!((r.d, r.s), (e.d, e.s));
        assert_eq!((r.value(70), r.value(101)), (-127, 0));
    }

    /// The integer dot equals the f64 dot of the dequantized weights with
    /// the dequantized activations (up to f32 rounding).
    #[test]
    fn scalar_int8_dot_matches_dequantized_reference() {
        let mut rng = Rng::new(6);
        for it in [Int8Type::Q8_0, Int8Type::Q4_0, Int8Type::Q4_1] {
            let qt = match it {
                Int8Type::Q8_0 => QuantType::Q8_0,
                Int8Type::Q4_0 => QuantType::Q4_0,
                Int8Type::Q4_1 => QuantType::Q4_1,
            };
            assert_eq!(Int8Type::from_quant(qt), Some(it));
            let n = 32 * 7;
            let w = quantize(qt.dtype(), &rng.vec(n, 1.0)).unwrap();
            let mut wf = vec![0.0; n];
            dequantize(qt.dtype(), &w, &mut wf).unwrap();
            let xq = Q8Act::quantize(&rng.vec(n, 1.0));
            let x = xq.row();
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for (i, (&wv, &q)) in wf.iter().zip(x.q).enumerate() {
                let p = wv as f64 * q as f64 * x.d[i / 32] as f64;
                want += p;
                mag += p.abs();
            }
            let got = dot_i8(it, &w, x) as f64;
            assert!((got - want).abs() <= 1e-5 * mag, "{it:?}: {got} vs {want}");
        }
        assert_eq!(Int8Type::from_quant(QuantType::Q4K), None);
    }
}
