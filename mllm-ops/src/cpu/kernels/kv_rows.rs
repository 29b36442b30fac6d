//! Cached key or value rows in the KV cache's storage type ([`KvDtype`]),
//! encoded when the cache op writes them and decoded by attention one tile
//! of one head at a time (never the whole cache).
//!
//! f32 rows are read in place. The other types decode a tile into a small
//! f32 buffer with exactly ggml's dequantization (`d·q`, `d·q + m`, the
//! f16 widened), so every SIMD decoder gives the portable one's bits; the
//! AVX2 decode kernel reads f16 rows in place too (`KvRows::in_place`)
//! and widens them in registers, exactly as the decoder does.

use std::ops::Range;
use std::sync::Arc;

use mllm_core::KvDtype;

use crate::quant::{f16_at, q4_1, q8_0, to_f16};

/// One page of a KV cache: a fixed number of rows in the cache's storage
/// type. Sequences that share a prefix share its pages (`Arc`), and a page
/// is copied only when a sequence writes into one it shares.
#[derive(Clone, Debug)]
pub enum KvPage {
    /// f32 rows, as computed.
    F32(Vec<f32>),
    /// Rows encoded as the cache's (non-f32) type.
    Encoded(Vec<u8>),
}

impl KvPage {
    fn data(&self, kind: KvDtype) -> KvData<'_> {
        match self {
            KvPage::F32(v) => KvData::F32(v),
            KvPage::Encoded(b) => KvData::Encoded(kind, b),
        }
    }
}

/// The rows of one sequence's keys or values: `rows() × row_len` values,
/// in one run or in pages.
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    store: Store<'a>,
    kind: KvDtype,
    rows: usize,
    row_len: usize,
}

#[derive(Clone, Copy)]
enum Store<'a> {
    /// All rows in one slice.
    Flat(KvData<'a>),
    /// Pages of `page_rows` rows; row `r` is row `r % page_rows` of page
    /// `r / page_rows`.
    Paged {
        pages: &'a [Arc<KvPage>],
        page_rows: usize,
    },
}

#[derive(Clone, Copy)]
enum KvData<'a> {
    F32(&'a [f32]),
    Encoded(KvDtype, &'a [u8]),
}

/// A decoded (or borrowed) tile of one head: row `r` of the tile is
/// `data[r * stride + off..][..dim]`.
#[derive(Clone, Copy)]
pub(crate) struct Tile<'b> {
    /// The tile's values.
    pub data: &'b [f32],
    /// Values between consecutive rows.
    pub stride: usize,
    /// Offset of the head within a row.
    pub off: usize,
}

impl Tile<'_> {
    /// The head's `dim` values of tile row `r`.
    #[inline(always)]
    pub fn row(&self, r: usize, dim: usize) -> &[f32] {
        &self.data[r * self.stride + self.off..][..dim]
    }
}

/// One head's f16 rows where they are stored: row `r` of the tile is
/// the `2 · dim` bytes at `data[r * stride + off..]`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct F16Tile<'b> {
    /// The rows' bytes.
    pub data: &'b [u8],
    /// Bytes between consecutive rows.
    pub stride: usize,
    /// Byte offset of the head within a row.
    pub off: usize,
}

/// Rows of one head read in place, in their storage type.
#[cfg(target_arch = "x86_64")]
pub(crate) enum InPlace<'b> {
    /// f32 rows.
    F32(Tile<'b>),
    /// f16 rows.
    F16(F16Tile<'b>),
}

/// The runs of rows that [`KvRows::in_place`] yields: each the rows of
/// the range that lie in one run (page), with their head in place.
#[cfg(target_arch = "x86_64")]
pub(crate) struct InPlaceRuns<'a> {
    rows: KvRows<'a>,
    next: usize,
    end: usize,
    off: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Iterator for InPlaceRuns<'a> {
    type Item = (Range<usize>, InPlace<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let (data, first) = self.rows.run_of(self.next);
        let end = self.rows.run_end(first, self.end);
        let local = self.next - first..end - first;
        let row_len = self.rows.row_len;
        let tile = match data {
            KvData::F32(v) => InPlace::F32(Tile {
                data: &v[local.start * row_len..local.end * row_len],
                stride: row_len,
                off: self.off,
            }),
            // f16 (`KvRows::in_place` checked every run's type).
            KvData::Encoded(kind, bytes) => {
                let row_bytes = kind.row_bytes(row_len);
                InPlace::F16(F16Tile {
                    data: &bytes[local.start * row_bytes..local.end * row_bytes],
                    stride: row_bytes,
                    off: kind.row_bytes(self.off),
                })
            }
        };
        let rows = self.next..end;
        self.next = end;
        Some((rows, tile))
    }
}

impl<'a> KvRows<'a> {
    /// f32 rows of `row_len` values.
    pub fn f32(rows: &'a [f32], row_len: usize) -> Self {
        debug_assert!(row_len > 0 && rows.len().is_multiple_of(row_len));
        KvRows {
            store: Store::Flat(KvData::F32(rows)),
            kind: KvDtype::F32,
            rows: rows.len() / row_len,
            row_len,
        }
    }

    /// Rows of `row_len` values stored as `kind` (`kind.row_bytes(row_len)`
    /// bytes each).
    pub fn encoded(kind: KvDtype, bytes: &'a [u8], row_len: usize) -> Self {
        debug_assert!(bytes.len().is_multiple_of(kind.row_bytes(row_len)));
        KvRows {
            store: Store::Flat(KvData::Encoded(kind, bytes)),
            kind,
            rows: bytes.len() / kind.row_bytes(row_len),
            row_len,
        }
    }

    /// The first `rows` rows of `pages`, each page holding `page_rows` rows
    /// of `row_len` values stored as `kind` (f32 pages for f32).
    pub fn paged(
        kind: KvDtype,
        pages: &'a [Arc<KvPage>],
        page_rows: usize,
        rows: usize,
        row_len: usize,
    ) -> Self {
        debug_assert!(page_rows > 0 && rows <= pages.len() * page_rows);
        KvRows {
            store: Store::Paged { pages, page_rows },
            kind,
            rows,
            row_len,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// The storage type.
    pub fn kind(&self) -> KvDtype {
        self.kind
    }

    /// The end of the run that starts at row `first`, or `end` if that is
    /// sooner.
    fn run_end(&self, first: usize, end: usize) -> usize {
        match self.store {
            Store::Paged { page_rows, .. } => (first + page_rows).min(end),
            Store::Flat(_) => end,
        }
    }

    /// The run of rows that holds row `r`: its data and its first row.
    fn run_of(&self, r: usize) -> (KvData<'a>, usize) {
        match self.store {
            Store::Flat(data) => (data, 0),
            Store::Paged { pages, page_rows } => {
                let p = r / page_rows;
                (pages[p].data(self.kind), p * page_rows)
            }
        }
    }

    /// Rows `rows` of the head at values `off..off + dim` of each row: f32
    /// rows in place when they lie in one run, otherwise (other types, or
    /// a tile across pages) copied or decoded into `buf` (`off` and `dim`
    /// whole blocks of the type). The values are the same either way.
    pub(crate) fn head_tile<'b>(
        &'b self,
        rows: Range<usize>,
        off: usize,
        dim: usize,
        buf: &'b mut Vec<f32>,
    ) -> Tile<'b> {
        debug_assert!(rows.end <= self.rows);
        let (data, first) = self.run_of(rows.start);
        let (_, last) = self.run_of(rows.end.max(rows.start + 1) - 1);
        if let (KvData::F32(v), true) = (data, first == last) {
            return Tile {
                data: &v[(rows.start - first) * self.row_len..(rows.end - first) * self.row_len],
                stride: self.row_len,
                off,
            };
        }
        let n = rows.len() * dim;
        let tile = grown(buf, n);
        let mut r = rows.start;
        while r < rows.end {
            let (data, first) = self.run_of(r);
            let end = self.run_end(first, rows.end);
            let out = &mut tile[(r - rows.start) * dim..(end - rows.start) * dim];
            self.decode_run(data, r - first..end - first, off, dim, out);
            r = end;
        }
        Tile {
            data: &buf[..n],
            stride: dim,
            off: 0,
        }
    }

    /// For f32 and f16 storage, the rows `rows` run by run (page by page)
    /// with the head at values `off..` of each row read in place; `None`
    /// for the types that must be decoded (see [`KvRows::head_tile`]), f32
    /// rows given as bytes among them.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn in_place(&self, rows: Range<usize>, off: usize) -> Option<InPlaceRuns<'a>> {
        debug_assert!(rows.end <= self.rows);
        let readable =
            |data: KvData<'_>| matches!(data, KvData::F32(_) | KvData::Encoded(KvDtype::F16, _));
        let all_readable = match self.store {
            Store::Flat(data) => readable(data),
            Store::Paged { pages, page_rows } => {
                let used = rows.start / page_rows..rows.end.div_ceil(page_rows);
                pages[used].iter().all(|p| readable(p.data(self.kind)))
            }
        };
        all_readable.then_some(InPlaceRuns {
            rows: *self,
            next: rows.start,
            end: rows.end,
            off,
        })
    }

    /// Reads one value of every cache line of the stored bytes of `rows`
    /// (those of them that exist), front to back, and drops them: run just
    /// before a kernel reads the rows head by head, a stride the hardware
    /// prefetchers do not follow, it brings them into the caches at the
    /// rate memory streams. Software prefetches of each next tile of rows
    /// did it at about a third of that: with this instead, one decode after
    /// 4096 tokens (SmolLM2's heads, f32 cache from memory) took 417 us
    /// instead of 785 on one thread and 211 instead of 414 on two.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn stream_rows(&self, rows: Range<usize>) {
        let end = rows.end.min(self.rows);
        let mut r = rows.start;
        let mut seen = 0u32;
        while r < end {
            let (data, first) = self.run_of(r);
            let run_end = self.run_end(first, end);
            let local = r - first..run_end - first;
            match data {
                KvData::F32(v) => {
                    let values = v.get(local.start * self.row_len..local.end * self.row_len);
                    let per_line = super::CACHE_LINE / std::mem::size_of::<f32>();
                    for x in values.unwrap_or_default().iter().step_by(per_line) {
                        seen ^= x.to_bits();
                    }
                }
                KvData::Encoded(kind, bytes) => {
                    let row_bytes = kind.row_bytes(self.row_len);
                    let run = bytes.get(local.start * row_bytes..local.end * row_bytes);
                    for &b in run.unwrap_or_default().iter().step_by(super::CACHE_LINE) {
                        seen ^= u32::from(b);
                    }
                }
            }
            r = run_end;
        }
        std::hint::black_box(seen);
    }

    /// Writes the head at `off..off + dim` of rows `local` of one run into
    /// consecutive rows of `dim` values of `out`.
    fn decode_run(
        &self,
        data: KvData<'_>,
        local: Range<usize>,
        off: usize,
        dim: usize,
        out: &mut [f32],
    ) {
        match data {
            KvData::F32(v) => {
                let rows = &v[local.start * self.row_len..local.end * self.row_len];
                for (src, o) in rows
                    .chunks_exact(self.row_len)
                    .zip(out.chunks_exact_mut(dim))
                {
                    o.copy_from_slice(&src[off..off + dim]);
                }
            }
            KvData::Encoded(kind, bytes) => {
                let row_bytes = kind.row_bytes(self.row_len);
                let head = kind.row_bytes(off)..kind.row_bytes(off + dim);
                let src = &bytes[local.start * row_bytes..local.end * row_bytes];
                decode_rows(kind, src, row_bytes, head, dim, out);
            }
        }
    }
}

/// The first `n` values of `buf`, which grows to hold them but is not
/// cleared: the tile decoders write every value, so zeroing a tile (16 KiB
/// for 64 keys of a 64-wide head) before every decode was wasted work.
fn grown(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// Encodes `src` (whole rows of a multiple-of-block length) as `kind` into
/// `dst` (`kind.row_bytes(src.len())` bytes): f16 and Q8_0 eight values
/// at a time where the CPU can (AVX2 and F16C), the same bytes as the
/// portable encoder.
pub fn encode(kind: KvDtype, src: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2_kv::available() {
        use super::simd::avx2_kv::{encode_f16, encode_q8_0};
        // SAFETY: `available` checked AVX2, FMA and F16C.
        match kind {
            KvDtype::F16 => return unsafe { encode_f16(src, dst) },
            KvDtype::Q8_0 => return unsafe { encode_q8_0(src, dst) },
            KvDtype::F32 | KvDtype::Q4_1 => {}
        }
    }
    encode_portable(kind, src, dst);
}

/// The portable encoder of [`encode`] (ggml's reference quantization for
/// the block types).
pub(crate) fn encode_portable(kind: KvDtype, src: &[f32], dst: &mut [u8]) {
    match kind {
        KvDtype::F32 => {
            for (o, &x) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        KvDtype::F16 => {
            for (o, &x) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&to_f16(x).0);
            }
        }
        KvDtype::Q8_0 => {
            let (blocks, _) = src.as_chunks::<{ q8_0::BLOCK_LEN }>();
            let (out, _) = dst.as_chunks_mut::<{ q8_0::BLOCK_BYTES }>();
            for (x, o) in blocks.iter().zip(out) {
                q8_0::quantize_block(x, o);
            }
        }
        KvDtype::Q4_1 => {
            let (blocks, _) = src.as_chunks::<{ q4_1::BLOCK_LEN }>();
            let (out, _) = dst.as_chunks_mut::<{ q4_1::BLOCK_BYTES }>();
            for (x, o) in blocks.iter().zip(out) {
                let mut y = *x;
                hadamard32(&mut y);
                quantize_q4_1_fitted(&y, o);
            }
        }
    }
}

/// Decodes the bytes `head` of every row of `src` (rows of `row_bytes`
/// encoded as `kind`) into consecutive rows of `dim` values of `out`, with
/// the widest decoder the CPU has.
fn decode_rows(
    kind: KvDtype,
    src: &[u8],
    row_bytes: usize,
    head: Range<usize>,
    dim: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::avx2_kv::available() {
        // SAFETY: `available` checked AVX2, FMA and F16C.
        unsafe { super::simd::avx2_kv::decode_rows(kind, src, row_bytes, head, dim, out) };
        return;
    }
    for (row, o) in src.chunks_exact(row_bytes).zip(out.chunks_exact_mut(dim)) {
        decode_portable(kind, &row[head.clone()], o);
    }
}

/// The portable decoder (ggml's reference dequantization).
pub(crate) fn decode_portable(kind: KvDtype, src: &[u8], out: &mut [f32]) {
    match kind {
        KvDtype::F32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        KvDtype::F16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_at(b, 0);
            }
        }
        KvDtype::Q8_0 => {
            let (blocks, _) = src.as_chunks::<{ q8_0::BLOCK_BYTES }>();
            let (outs, _) = out.as_chunks_mut::<{ q8_0::BLOCK_LEN }>();
            for (b, o) in blocks.iter().zip(outs) {
                q8_0::dequantize_block(b, o);
            }
        }
        KvDtype::Q4_1 => {
            let (blocks, _) = src.as_chunks::<{ q4_1::BLOCK_BYTES }>();
            let (outs, _) = out.as_chunks_mut::<{ q4_1::BLOCK_LEN }>();
            for (b, o) in blocks.iter().zip(outs) {
                q4_1::dequantize_block(b, o);
                hadamard32(o);
            }
        }
    }
}

/// Q4_1 with the scale and minimum refitted by least squares to the
/// values' nibbles (twice), keeping whichever of the plain and the refitted
/// encodings reproduces `x` more closely.
fn quantize_q4_1_fitted(x: &[f32; 32], out: &mut [u8; q4_1::BLOCK_BYTES]) {
    let error = |b: &[u8; q4_1::BLOCK_BYTES]| {
        let mut y = [0f32; 32];
        q4_1::dequantize_block(b, &mut y);
        y.iter().zip(x).map(|(a, b)| (a - b) * (a - b)).sum::<f32>()
    };
    q4_1::quantize_block(x, out);
    let mut best = error(out);
    let mut cand = *out;
    for _ in 0..2 {
        let q = q4_1::nibbles(&cand).map(f32::from);
        let n = 32.0;
        let (sq, sx) = (q.iter().sum::<f32>(), x.iter().sum::<f32>());
        let sqq = q.iter().map(|v| v * v).sum::<f32>();
        let sqx = q.iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            break;
        }
        let d = (n * sqx - sq * sx) / det;
        let m = (sx - d * sq) / n;
        if d <= 0.0 {
            break;
        }
        let (db, d) = to_f16(d);
        let (mb, m) = to_f16(m);
        cand[..2].copy_from_slice(&db);
        cand[2..4].copy_from_slice(&mb);
        let qv = |v: f32| (((v - m) / d).round().clamp(0.0, 15.0)) as u8;
        for j in 0..16 {
            cand[4 + j] = qv(x[j]) | (qv(x[j + 16]) << 4);
        }
        let e = error(&cand);
        if e < best {
            best = e;
            *out = cand;
        }
    }
}

/// The orthonormal Walsh-Hadamard transform of 32 values, in place (its
/// own inverse): butterflies of stride 1, 2, 4, 8, 16, then a scale.
pub(crate) fn hadamard32(x: &mut [f32; 32]) {
    let mut h = 1;
    while h < 32 {
        for i in (0..32).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let norm = 1.0 / 32f32.sqrt();
    for v in x.iter_mut() {
        *v *= norm;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::{bits, Rng};

    /// Encoded rows of SmolLM2's width (3 heads of 64) in every type.
    fn rows(kind: KvDtype, n: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
        let row_len = 192;
        let x = Rng::new(seed).vec(n * row_len, 3.0);
        let mut bytes = vec![0u8; n * kind.row_bytes(row_len)];
        encode(kind, &x, &mut bytes);
        (x, bytes)
    }

    #[test]
    fn decoding_reproduces_each_type_within_its_precision() {
        for kind in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
            let (x, bytes) = rows(kind, 5, 7);
            let kv = KvRows::encoded(kind, &bytes, 192);
            assert_eq!(kv.rows(), 5);
            let mut buf = Vec::new();
            for head in 0..3 {
                let tile = kv.head_tile(0..5, head * 64, 64, &mut buf);
                for r in 0..5 {
                    let want = &x[r * 192 + head * 64..][..64];
                    for (got, want) in tile.row(r, 64).chunks(32).zip(want.chunks(32)) {
                        check_block(kind, got, want.try_into().unwrap());
                    }
                }
            }
        }
    }

    /// The error bound of each type on one block of 32 values.
    fn check_block(kind: KvDtype, got: &[f32], want: &[f32; 32]) {
        let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        match kind {
            // Round to nearest f16: half an ulp (2^-11 relative).
            KvDtype::F16 => {
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() <= w.abs() / 2048.0, "{g} vs {w}");
                }
            }
            // Half a step of amax / 127, plus the f16 rounding of the step.
            KvDtype::Q8_0 => {
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() <= 0.6 * amax / 127.0, "{g} vs {w}");
                }
            }
            // Half a step of the rotated block's range / 15 on each rotated
            // value (plus f16 rounding); the rotation keeps the L2 norm.
            KvDtype::Q4_1 => {
                let mut y = *want;
                hadamard32(&mut y);
                let (lo, hi) = y
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (g - w) * (g - w))
                    .sum::<f32>()
                    .sqrt();
                let bound = 0.55 * (hi - lo) / 15.0 * 32f32.sqrt();
                assert!(err <= bound, "L2 error {err} over {bound}");
            }
            KvDtype::F32 => assert_eq!(got, want),
        }
    }

    #[test]
    fn hadamard_is_its_own_inverse_and_keeps_the_norm() {
        let x: [f32; 32] = Rng::new(5).vec(32, 2.0).try_into().unwrap();
        let mut y = x;
        hadamard32(&mut y);
        let norm = |v: &[f32; 32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm(&x) - norm(&y)).abs() <= 1e-5 * norm(&x));
        // A spike spreads evenly over every value.
        let mut spike = [0f32; 32];
        spike[5] = 32f32.sqrt();
        hadamard32(&mut spike);
        assert!(
            spike.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6),
            "{spike:?}"
        );
        hadamard32(&mut y);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn fitted_q4_is_never_worse_than_plain_q4_1() {
        let mut rng = Rng::new(9);
        let mut totals = (0f32, 0f32);
        for _ in 0..200 {
            let x: [f32; 32] = rng.vec(32, 4.0).try_into().unwrap();
            let err = |b: &[u8; q4_1::BLOCK_BYTES]| {
                let mut y = [0f32; 32];
                q4_1::dequantize_block(b, &mut y);
                y.iter()
                    .zip(&x)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f32>()
            };
            let (mut plain, mut fitted) = ([0u8; 20], [0u8; 20]);
            q4_1::quantize_block(&x, &mut plain);
            quantize_q4_1_fitted(&x, &mut fitted);
            assert!(err(&fitted) <= err(&plain));
            totals.0 += err(&plain);
            totals.1 += err(&fitted);
        }
        // And the refit helps: measured 0.78 of the plain squared error.
        assert!(totals.1 < 0.9 * totals.0, "{totals:?}");
    }

    #[test]
    fn f32_tiles_are_read_in_place() {
        let x = Rng::new(3).vec(4 * 192, 1.0);
        let kv = KvRows::f32(&x, 192);
        let mut buf = Vec::new();
        let tile = kv.head_tile(1..3, 128, 64, &mut buf);
        assert_eq!(tile.row(1, 64), &x[2 * 192 + 128..3 * 192]);
        assert_eq!(tile.data.as_ptr(), x[192..].as_ptr());
        assert!(buf.is_empty());
        // f32 rows given as bytes are decoded, never read in place as f16.
        let mut bytes = vec![0u8; 4 * x.len()];
        encode(KvDtype::F32, &x, &mut bytes);
        let as_bytes = KvRows::encoded(KvDtype::F32, &bytes, 192);
        #[cfg(target_arch = "x86_64")]
        {
            assert!(as_bytes.in_place(0..4, 0).is_none());
            assert!(kv.in_place(0..4, 0).is_some());
        }
        let tile = as_bytes.head_tile(1..3, 128, 64, &mut buf);
        assert_eq!(tile.row(1, 64), &x[2 * 192 + 128..3 * 192]);
    }

    /// Pages hold the same rows as one run: a tile inside a page, across
    /// pages or over all of them has the flat tile's values, bit for bit.
    #[test]
    fn tiles_across_pages_equal_tiles_of_one_run() {
        for kind in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
            let (x, bytes) = rows(kind, 10, 13);
            let flat = match kind {
                KvDtype::F32 => KvRows::f32(&x, 192),
                _ => KvRows::encoded(kind, &bytes, 192),
            };
            // Pages of 4 rows; the last one only half used.
            let rb = kind.row_bytes(192);
            let pages: Vec<Arc<KvPage>> = (0..3)
                .map(|p| {
                    let mut b = bytes[(p * 4 * rb).min(bytes.len())..].to_vec();
                    b.resize(4 * rb, 0);
                    b.truncate(4 * rb);
                    Arc::new(match kind {
                        KvDtype::F32 => KvPage::F32(
                            b.chunks_exact(4)
                                .map(|v| f32::from_le_bytes(v.try_into().unwrap()))
                                .collect(),
                        ),
                        _ => KvPage::Encoded(b),
                    })
                })
                .collect();
            let paged = KvRows::paged(kind, &pages, 4, 10, 192);
            assert_eq!((paged.rows(), paged.kind()), (10, kind));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for range in [0..10, 3..9, 4..8, 5..6, 7..10, 0..4] {
                // Streaming rows, also past the last one, reads only the
                // rows that exist and must not panic on any run layout.
                #[cfg(target_arch = "x86_64")]
                for rows in [&flat, &paged] {
                    rows.stream_rows(range.start..range.end + 5);
                }
                for head in 0..3 {
                    let want = flat.head_tile(range.clone(), head * 64, 64, &mut a);
                    let got = paged.head_tile(range.clone(), head * 64, 64, &mut b);
                    for r in 0..range.len() {
                        assert_eq!(
                            bits(got.row(r, 64)),
                            bits(want.row(r, 64)),
                            "{kind} {range:?} head {head} row {r}"
                        );
                    }
                    #[cfg(target_arch = "x86_64")]
                    in_place_runs_hold_the_tile(&paged, range.clone(), head, &want);
                }
            }
        }
    }

    /// `rows.in_place` over `range` (pages of 4 rows) yields the range in
    /// order, one run per page, whose head `head` holds `want`'s values
    /// (f16 widened); the types that must be decoded yield nothing.
    #[cfg(target_arch = "x86_64")]
    fn in_place_runs_hold_the_tile(
        rows: &KvRows<'_>,
        range: Range<usize>,
        head: usize,
        want: &Tile<'_>,
    ) {
        let Some(runs) = rows.in_place(range.clone(), head * 64) else {
            assert!(matches!(rows.kind(), KvDtype::Q8_0 | KvDtype::Q4_1));
            return;
        };
        let mut next = range.start;
        for (run, tile) in runs {
            assert_eq!(run.start, next, "{range:?}");
            assert!(
                !run.is_empty() && (run.end - 1) / 4 == run.start / 4,
                "{run:?}"
            );
            for r in run.clone() {
                let mut got = [0f32; 64];
                match tile {
                    InPlace::F32(t) => got.copy_from_slice(t.row(r - run.start, 64)),
                    InPlace::F16(t) => {
                        let at = (r - run.start) * t.stride + t.off;
                        decode_portable(KvDtype::F16, &t.data[at..at + 128], &mut got);
                    }
                }
                let want = want.row(r - range.start, 64);
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} {range:?} head {head} row {r}", rows.kind());
            }
            next = run.end;
        }
        assert_eq!(next, range.end, "{range:?}");
    }

    /// A tile decoded into a buffer that holds an earlier, longer tile
    /// (here all NaN) has every value of its rows: the buffer is reused,
    /// not cleared.
    #[test]
    fn tiles_overwrite_a_reused_buffer() {
        for kind in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
            let (_, bytes) = rows(kind, 6, 17);
            let kv = KvRows::encoded(kind, &bytes, 192);
            let rb = kind.row_bytes(192);
            for head in 0..3 {
                let mut buf = vec![f32::NAN; 10 * 64];
                let tile = kv.head_tile(2..5, head * 64, 64, &mut buf);
                for r in 0..3 {
                    let mut want = [0f32; 64];
                    let row = &bytes[(2 + r) * rb..][..rb];
                    let at = kind.row_bytes(head * 64)..kind.row_bytes(head * 64 + 64);
                    decode_portable(kind, &row[at], &mut want);
                    assert_eq!(tile.row(r, 64), want, "{kind} head {head} row {r}");
                }
            }
        }
    }

    /// Whether this CPU lacks what the SIMD encoders and decoders need
    /// (said on stderr).
    #[cfg(target_arch = "x86_64")]
    fn lacks_simd_kv() -> bool {
        let lacks = !crate::cpu::kernels::simd::avx2_kv::available();
        if lacks {
            eprintln!("skipping: no AVX2/FMA/F16C");
        }
        lacks
    }

    /// The SIMD row decoder gives the portable decoder's bits for every
    /// head of a row, whole groups of eight values or not.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_head_decoder_equals_the_portable_one() {
        if lacks_simd_kv() {
            return;
        }
        let f16_rows = |row_len: usize| {
            let x = Rng::new(19).vec(7 * row_len, 3.0);
            let mut bytes = vec![0u8; 7 * KvDtype::F16.row_bytes(row_len)];
            encode(KvDtype::F16, &x, &mut bytes);
            bytes
        };
        let cases = [
            (KvDtype::F16, f16_rows(192), 192, 64),
            (KvDtype::F16, f16_rows(36), 36, 12),
            (KvDtype::Q8_0, rows(KvDtype::Q8_0, 7, 19).1, 192, 64),
            (KvDtype::Q4_1, rows(KvDtype::Q4_1, 7, 19).1, 192, 64),
        ];
        for (kind, bytes, row_len, dim) in cases {
            let rb = kind.row_bytes(row_len);
            for head in 0..row_len / dim {
                let at = kind.row_bytes(head * dim)..kind.row_bytes(head * dim + dim);
                let mut want = vec![0f32; 7 * dim];
                for (row, o) in bytes.chunks_exact(rb).zip(want.chunks_exact_mut(dim)) {
                    decode_portable(kind, &row[at.clone()], o);
                }
                let mut got = vec![f32::NAN; 7 * dim];
                // SAFETY: AVX2, FMA and F16C were checked above.
                unsafe {
                    crate::cpu::kernels::simd::avx2_kv::decode_rows(
                        kind, &bytes, rb, at, dim, &mut got,
                    )
                };
                assert_eq!(bits(&got), bits(&want), "{kind} dim {dim} head {head}");
            }
        }
    }

    /// The f16 encoder writes the portable encoder's bytes: random values
    /// of every magnitude, values that round to even or overflow to
    /// infinity, subnormals, zeros and infinities, in lengths with and
    /// without a tail of fewer than eight (NaN stays NaN).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_f16_encoder_equals_the_portable_one() {
        if lacks_simd_kv() {
            return;
        }
        let mut x: Vec<f32> = Rng::new(23).vec(4096, 1.0);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= 2f32.powi(i as i32 % 48 - 30);
        }
        let specials = [
            0.0,
            -0.0,
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            65504.0,
            65519.0,
            65520.0,
            -1e9,
            6e-8,
            3e-8,
            1e-5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        x.extend_from_slice(&specials);
        for len in [x.len(), 4096, 13, 8, 5] {
            let src = &x[x.len() - len..];
            let mut want = vec![0u8; 2 * len];
            encode_portable(KvDtype::F16, src, &mut want);
            let mut got = vec![0xAB; 2 * len];
            encode(KvDtype::F16, src, &mut got);
            for (i, (g, w)) in got.chunks(2).zip(want.chunks(2)).enumerate() {
                let (g, w) = (f16_at(g, 0), f16_at(w, 0));
                if src[i].is_nan() {
                    assert!(g.is_nan() && w.is_nan(), "value {i} of {len}");
                } else {
                    assert_eq!(g.to_bits(), w.to_bits(), "value {i} of {len}: {}", src[i]);
                }
            }
        }
    }

    /// The Q8_0 encoder writes the portable quantizer's bytes: random
    /// blocks of every magnitude, a block whose scale is exactly 1 with
    /// values on and next to the halves (ties round away from zero), a
    /// zero block, blocks with NaN and infinities, a block so small that
    /// the reciprocal of its scale overflows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_q8_0_encoder_equals_the_portable_one() {
        if lacks_simd_kv() {
            return;
        }
        let mut x: Vec<f32> = Rng::new(29).vec(32 * 64, 1.0);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= 2f32.powi((i / 32) as i32 % 40 - 20);
        }
        let mut ties = vec![127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5];
        ties.extend([3.5f32, -3.5, 4.5].map(|t| t.next_down()));
        ties.extend([3.5f32, -3.5, 4.5].map(|t| t.next_up()));
        ties.resize(32, -0.0);
        x.extend(ties);
        x.extend([0.0f32; 32]);
        let mut odd = vec![1.0f32; 32];
        odd[3] = f32::NAN;
        odd[7] = -3.0;
        x.extend(&odd);
        odd[9] = f32::INFINITY;
        odd[10] = f32::NEG_INFINITY;
        x.extend(&odd);
        let mut tiny = vec![1e-40f32; 32];
        tiny[1] = 0.0;
        tiny[2] = -3e-41;
        x.extend(tiny);
        let blocks = x.len() / 32;
        let mut want = vec![0u8; blocks * 34];
        encode_portable(KvDtype::Q8_0, &x, &mut want);
        let mut got = vec![0xAB; blocks * 34];
        encode(KvDtype::Q8_0, &x, &mut got);
        for (b, (g, w)) in got.chunks(34).zip(want.chunks(34)).enumerate() {
            assert_eq!(g, w, "block {b}: {:?}", &x[32 * b..32 * b + 32]);
        }
    }

    /// The SIMD decoders give the portable decoder's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_decoders_equal_the_portable_one() {
        if lacks_simd_kv() {
            return;
        }
        for kind in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
            let (_, bytes) = rows(kind, 9, 11);
            let mut want = vec![0f32; 9 * 192];
            decode_portable(kind, &bytes, &mut want);
            let mut got = vec![f32::NAN; 9 * 192];
            // SAFETY: AVX2, FMA and F16C were checked above.
            unsafe { crate::cpu::kernels::simd::avx2_kv::decode(kind, &bytes, &mut got) };
            assert_eq!(bits(&got), bits(&want), "{kind}");
        }
    }
}
