//! AVX2 decode kernels that take up to three query heads of one KV head
//! per pass over its cached rows: the key scores four keys at a time (three
//! for f16 rows, eight for a head alone), the weighted values 32 dimensions
//! at a time (64 for a head alone). f32 rows are read in place and f16 rows
//! widened in registers, so a key or value row is loaded once for all the
//! heads that share it, with no tile buffer in between.
//!
//! Every (head, key) score is the same sequence of operations whichever
//! keys and heads share its pass: eight-lane multiply-adds over the head
//! dimension in order, then the lanes summed as
//! `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`, then the scale.
//! Every output value adds `p_j · v_j` key after key. So a query's result
//! depends only on its keys, never on how rows are paged, tiled or split.

use std::arch::x86_64::*;

use crate::cpu::kernels::kv_rows::{F16Tile, Tile};
use crate::cpu::kernels::simd::avx2::{load, store};
use crate::cpu::kernels::simd::avx2_packed::f16x8;
use crate::cpu::kernels::simd::inline_array;

/// Keys scored per pass (one fewer for rows that are widened, see
/// [`HeadRows::WIDENS`]).
const KEYS: usize = 4;
/// Query heads per pass: with [`KEYS`] keys, 12 accumulators, three query
/// vectors and one key vector fill the 16 AVX2 registers.
const HEADS: usize = 3;

/// Rows of one head, read 64 values at a time.
pub(super) trait HeadRows: Copy {
    /// Whether reading eight values takes a register of their own (a
    /// widening): three heads then score one key fewer per pass. With
    /// four, 12 accumulators, 3 queries and the widened key left no
    /// register to spare and the compiler kept accumulators on the stack
    /// (on a Zen 3, with the rows in L3, the time was the same either way).
    const WIDENS: bool;

    /// 64 consecutive values of one row, as stored.
    type Chunk: Copy;

    /// Values `64 c..64 c + 64` of row `r`'s head.
    fn chunk(&self, r: usize, c: usize) -> Self::Chunk;

    /// Values `8 i..8 i + 8` of `chunk` as f32 (`i < 8`).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, FMA and F16C.
    unsafe fn lanes(chunk: Self::Chunk, i: usize) -> __m256;
}

impl<'b> HeadRows for Tile<'b> {
    const WIDENS: bool = false;
    type Chunk = &'b [f32; 64];

    #[inline(always)]
    fn chunk(&self, r: usize, c: usize) -> Self::Chunk {
        array_at(self.data, r * self.stride + self.off + 64 * c)
    }

    /// # Safety
    ///
    /// As [`HeadRows::lanes`]: the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn lanes(chunk: Self::Chunk, i: usize) -> __m256 {
        load(&chunk[8 * i..])
    }
}

impl<'b> HeadRows for F16Tile<'b> {
    const WIDENS: bool = true;
    type Chunk = &'b [u8; 128];

    #[inline(always)]
    fn chunk(&self, r: usize, c: usize) -> Self::Chunk {
        array_at(self.data, r * self.stride + self.off + 128 * c)
    }

    /// # Safety
    ///
    /// As [`HeadRows::lanes`]: the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn lanes(chunk: Self::Chunk, i: usize) -> __m256 {
        f16x8(&chunk[16 * i..])
    }
}

/// The `N` elements of `data` from `at` (a bounds check, then none for
/// the kernel's fixed offsets into them).
#[inline(always)]
fn array_at<T, const N: usize>(data: &[T], at: usize) -> &[T; N] {
    data[at..][..N].try_into().expect("N elements")
}

/// `scores[h · len + j0 + r] = scale · q_h · k_r` for the `n` rows `k_r`
/// of `rows` and every head `q_h` of `q` (heads of `hd` values, a multiple
/// of 64).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scores<R: HeadRows>(
    q: &[f32],
    hd: usize,
    rows: R,
    n: usize,
    scale: f32,
    scores: &mut [f32],
    len: usize,
    j0: usize,
) {
    let heads = q.len() / hd;
    let mut h0 = 0;
    while h0 < heads {
        let h = (heads - h0).min(HEADS);
        let (q, out) = (&q[h0 * hd..], &mut scores[h0 * len + j0..]);
        match h {
            3 => score_heads::<3, R>(head_slices(q, hd), hd, rows, n, scale, out, len),
            2 => score_heads::<2, R>(head_slices(q, hd), hd, rows, n, scale, out, len),
            _ => score_heads::<1, R>(head_slices(q, hd), hd, rows, n, scale, out, len),
        }
        h0 += h;
    }
}

/// The first `H` heads of `hd` values of `q`.
#[inline(always)]
fn head_slices<const H: usize>(q: &[f32], hd: usize) -> [&[f32]; H] {
    inline_array::from_fn(|h| &q[h * hd..][..hd])
}

/// [`scores`] of `H` heads; `out[h · len + r]` is head `h`'s score of row
/// `r`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn score_heads<const H: usize, R: HeadRows>(
    q: [&[f32]; H],
    hd: usize,
    rows: R,
    n: usize,
    scale: f32,
    out: &mut [f32],
    len: usize,
) {
    // One head alone takes eight keys, as many independent sums as the
    // multiply-adds in flight need.
    let mut r = if H == 1 {
        score_groups::<H, 8, R>(q, hd, rows, n, scale, out, len)
    } else if R::WIDENS && H == HEADS {
        score_groups::<H, { KEYS - 1 }, R>(q, hd, rows, n, scale, out, len)
    } else {
        score_groups::<H, KEYS, R>(q, hd, rows, n, scale, out, len)
    };
    while r < n {
        let acc = dots::<H, 1, R>(q, hd, rows, r);
        for (h, [a]) in acc.into_iter().enumerate() {
            out[h * len + r] = sum_lanes(a) * scale;
        }
        r += 1;
    }
}

/// The scores of [`score_heads`] for rows `K` at a time (`K <= 8`), as far
/// as whole groups go; returns the number of rows scored.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn score_groups<const H: usize, const K: usize, R: HeadRows>(
    q: [&[f32]; H],
    hd: usize,
    rows: R,
    n: usize,
    scale: f32,
    out: &mut [f32],
    len: usize,
) -> usize {
    let (scale4, zero) = (_mm_set1_ps(scale), _mm256_setzero_ps());
    let mut r = 0;
    while r + K <= n {
        let acc = dots::<H, K, R>(q, hd, rows, r);
        for (h, a) in acc.into_iter().enumerate() {
            for j0 in (0..K).step_by(4) {
                // Missing rows of a group of fewer than four are zero lanes.
                let a4 = inline_array::from_fn(|j| a.get(j0 + j).copied().unwrap_or(zero));
                let mut s = [0.0f32; 4];
                // SAFETY: `s` holds 4 floats and `storeu` has no alignment
                // requirement.
                unsafe { _mm_storeu_ps(s.as_mut_ptr(), _mm_mul_ps(sum_lanes4(a4), scale4)) };
                let k = (K - j0).min(4);
                out[h * len + r + j0..][..k].copy_from_slice(&s[..k]);
            }
        }
        r += K;
    }
    r
}

/// Per head and per row `r0..r0 + K`, the eight lane sums of the products
/// of the query with the row over the whole head.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dots<const H: usize, const K: usize, R: HeadRows>(
    q: [&[f32]; H],
    hd: usize,
    rows: R,
    r0: usize,
) -> [[__m256; K]; H] {
    let mut acc = [[_mm256_setzero_ps(); K]; H];
    for c in 0..hd / 64 {
        let qc = inline_array::map(q, |qh| -> &[f32; 64] {
            qh[64 * c..64 * c + 64].try_into().expect("64 values")
        });
        let kc: [R::Chunk; K] = inline_array::from_fn(|k| rows.chunk(r0 + k, c));
        for i in 0..8 {
            for (k, &chunk) in kc.iter().enumerate() {
                // SAFETY: this kernel is compiled for AVX2, FMA and F16C,
                // which its callers checked.
                let kv = unsafe { R::lanes(chunk, i) };
                for (a, qh) in acc.iter_mut().zip(qc) {
                    a[k] = _mm256_fmadd_ps(load(&qh[8 * i..]), kv, a[k]);
                }
            }
        }
    }
    acc
}

/// The lane sums of four rows' accumulators, in the tree of the module
/// documentation: pairs, then pairs of pairs, then the two halves.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sum_lanes4(a: [__m256; 4]) -> __m128 {
    let u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u))
}

/// The sum of one accumulator's lanes, in the same tree as [`sum_lanes4`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sum_lanes(a: __m256) -> f32 {
    let mut l = [0.0f32; 8];
    store(&mut l, a);
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// `o_h += Σ_r probs[h · len + j0 + r] · v_r` over the `n` rows `v_r` of
/// `rows`, for every head `o_h` of `o` (heads of `hd` values, a multiple
/// of 64).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn add_values<R: HeadRows>(
    probs: &[f32],
    len: usize,
    j0: usize,
    rows: R,
    n: usize,
    o: &mut [f32],
    hd: usize,
) {
    let heads = o.len() / hd;
    let mut h0 = 0;
    while h0 < heads {
        let h = (heads - h0).min(HEADS);
        let p = &probs[h0 * len + j0..];
        let out = &mut o[h0 * hd..(h0 + h) * hd];
        // One head alone takes 64 dimensions a pass, for eight sums in
        // flight.
        match h {
            3 => add_heads::<3, 4, R>(prob_rows(p, len, n), rows, out, hd),
            2 => add_heads::<2, 4, R>(prob_rows(p, len, n), rows, out, hd),
            _ => add_heads::<1, 8, R>(prob_rows(p, len, n), rows, out, hd),
        }
        h0 += h;
    }
}

/// The first `n` probabilities of each of `H` rows `len` apart.
#[inline(always)]
fn prob_rows<const H: usize>(p: &[f32], len: usize, n: usize) -> [&[f32]; H] {
    inline_array::from_fn(|h| &p[h * len..][..n])
}

/// [`add_values`] of `H` heads (`o` holds exactly their `H · hd` values),
/// `8 V` dimensions of every head per pass over the rows (`V` divides 8).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn add_heads<const H: usize, const V: usize, R: HeadRows>(
    probs: [&[f32]; H],
    rows: R,
    o: &mut [f32],
    hd: usize,
) {
    let n = probs[0].len();
    for d0 in (0..hd).step_by(8 * V) {
        let (c, i0) = (d0 / 64, d0 % 64 / 8);
        let mut acc: [[__m256; V]; H] =
            inline_array::from_fn(|h| inline_array::from_fn(|i| load(&o[h * hd + d0 + 8 * i..])));
        for r in 0..n {
            let chunk = rows.chunk(r, c);
            // One value vector at a time against every head's weight:
            // 12 accumulators, 3 weights and 1 value fill the registers.
            let p = inline_array::map(probs, |p| _mm256_set1_ps(p[r]));
            for i in 0..V {
                // SAFETY: this kernel is compiled for AVX2, FMA and F16C,
                // which its callers checked.
                let v = unsafe { R::lanes(chunk, i0 + i) };
                for (a, &p) in acc.iter_mut().zip(&p) {
                    a[i] = _mm256_fmadd_ps(p, v, a[i]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (i, &a) in a.iter().enumerate() {
                store(&mut o[h * hd + d0 + 8 * i..], a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::kv_rows::{decode_portable, encode};
    use crate::cpu::kernels::test_util::{bits, Rng};
    use mllm_core::KvDtype;

    /// Whether this CPU lacks what the kernels need (said on stderr).
    fn skip() -> bool {
        let has = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if !has {
            eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
        }
        !has
    }

    /// Head 1 of the rows of [`cache`] as the kernels read them: the f32
    /// rows and the f16 bytes in place.
    fn views<'a>(x: &'a [f32], b: &'a [u8], hd: usize) -> (Tile<'a>, F16Tile<'a>) {
        let f32_rows = Tile {
            data: x,
            stride: 3 * hd,
            off: hd,
        };
        let f16_rows = F16Tile {
            data: b,
            stride: 6 * hd,
            off: 2 * hd,
        };
        (f32_rows, f16_rows)
    }

    /// The score the module documentation specifies: lane `d % 8` takes the
    /// products in order, then the fixed tree, then the scale.
    fn score_model(q: &[f32], k: &[f32], scale: f32) -> f32 {
        let mut l = [0.0f32; 8];
        for (d, (&a, &b)) in q.iter().zip(k).enumerate() {
            l[d % 8] = a.mul_add(b, l[d % 8]);
        }
        (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale
    }

    /// Rows of three kv heads of `hd` (the kernels read head 1): as f32
    /// values, and as f16 bytes with the f32 values they decode to.
    fn cache(n: usize, hd: usize, seed: u64) -> (Vec<f32>, Vec<u8>, Vec<f32>) {
        let x = Rng::new(seed).vec(n * 3 * hd, 2.0);
        let mut b = vec![0u8; 2 * x.len()];
        encode(KvDtype::F16, &x, &mut b);
        let mut widened = vec![0.0f32; x.len()];
        decode_portable(KvDtype::F16, &b, &mut widened);
        (x, b, widened)
    }

    /// Head 1 of row `r` of `x` (rows of three heads of `hd`).
    fn head(x: &[f32], r: usize, hd: usize) -> &[f32] {
        &x[(3 * r + 1) * hd..][..hd]
    }

    /// Every head count (whole passes of three and the rest), row counts
    /// with and without a tail of single keys, f32 and f16 rows: each score
    /// has the model's bits and only the scores of these rows are written.
    #[test]
    fn scores_have_the_bits_of_the_model_for_any_heads_and_keys() {
        if skip() {
            return;
        }
        for hd in [64, 128] {
            for (heads, n) in [(1, 1), (2, 5), (3, 8), (4, 3), (5, 13), (7, 9), (9, 16)] {
                let q = Rng::new(7).vec(heads * hd, 1.0);
                let (x, b, widened) = cache(n, hd, 11);
                let (len, j0, scale) = (n + 6, 2, 0.125);
                let (f32_rows, f16_rows) = views(&x, &b, hd);
                let mut got = [vec![f32::NAN; heads * len], vec![f32::NAN; heads * len]];
                // SAFETY: AVX2, FMA and F16C were checked above.
                unsafe {
                    scores(&q, hd, f32_rows, n, scale, &mut got[0], len, j0);
                    scores(&q, hd, f16_rows, n, scale, &mut got[1], len, j0);
                }
                for (got, rows) in got.iter().zip([&x, &widened]) {
                    let mut want = vec![f32::NAN; heads * len];
                    for h in 0..heads {
                        for r in 0..n {
                            let qh = &q[h * hd..][..hd];
                            want[h * len + j0 + r] = score_model(qh, head(rows, r, hd), scale);
                        }
                    }
                    assert_eq!(bits(got), bits(&want), "hd {hd} heads {heads} keys {n}");
                }
            }
        }
    }

    /// Weighted values of f32 and f16 rows, added to what the output held,
    /// key after key: the bits of one `mul_add` chain per output value.
    #[test]
    fn values_add_in_key_order_for_any_heads() {
        if skip() {
            return;
        }
        for hd in [64, 128] {
            for (heads, n) in [(1, 1), (2, 6), (3, 7), (4, 12), (7, 5)] {
                let (len, j0) = (n + 3, 3);
                let probs = Rng::new(5).vec(heads * len, 1.0);
                let start = Rng::new(6).vec(heads * hd, 1.0);
                let (x, b, widened) = cache(n, hd, 12);
                let (f32_rows, f16_rows) = views(&x, &b, hd);
                let mut got = [start.clone(), start.clone()];
                // SAFETY: AVX2, FMA and F16C were checked above.
                unsafe {
                    add_values(&probs, len, j0, f32_rows, n, &mut got[0], hd);
                    add_values(&probs, len, j0, f16_rows, n, &mut got[1], hd);
                }
                for (got, rows) in got.iter().zip([&x, &widened]) {
                    let mut want = start.clone();
                    for (h, o) in want.chunks_exact_mut(hd).enumerate() {
                        for r in 0..n {
                            let p = probs[h * len + j0 + r];
                            for (o, &v) in o.iter_mut().zip(head(rows, r, hd)) {
                                *o = p.mul_add(v, *o);
                            }
                        }
                    }
                    assert_eq!(bits(got), bits(&want), "hd {hd} heads {heads} keys {n}");
                }
            }
        }
    }
}
