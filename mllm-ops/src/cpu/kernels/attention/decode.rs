//! One query's attention over its cached keys (a decode step): tasks of
//! the query heads that share a kv head, and, on AVX2 over more than a few
//! keys, the keys split into parts whose partial softmax sums are combined
//! in order, so that the threads share one query.

use rayon::prelude::*;
use rayon::ThreadPool;

use super::{AttnShape, SeqAttention};
use crate::cpu::kernels::kv_rows::KvRows;
use crate::cpu::kernels::matmul::{axpy, dot};
use crate::cpu::kernels::qkernel::SimdLevel;
use crate::cpu::kernels::softmax::softmax_in_place;

/// Runs the decode of `seq` (one query at a time; see the module
/// documentation) into `out`, in `pool` when `parallel`, over `visible`
/// keys in all, with SIMD levels up to `max`.
pub(super) fn run(
    seq: &SeqAttention<'_>,
    shape: &AttnShape,
    out: &mut [f32],
    pool: &ThreadPool,
    parallel: bool,
    visible: usize,
    // Only x86-64 has attention kernels beyond the portable ones.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] max: SimdLevel,
) {
    let SeqAttention { q, n_q, past, k, v } = *seq;
    let (n_heads, n_kv_heads, head_dim) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
    let q_stride = n_heads * head_dim;
    let group = (n_heads / n_kv_heads).max(1);
    let window = shape.sliding_window.map(|w| w.max(1));
    let threads = pool.current_num_threads().max(1);
    #[cfg(target_arch = "x86_64")]
    let avx2 = SimdLevel::Avx2.at_most(max)
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    // One decode over more than a few keys: every task keeps all heads of
    // its kv head (each key and value row read once) and its keys are split
    // into parts instead.
    let split = avx2 && n_q == 1 && head_dim.is_multiple_of(64) && visible > MIN_SPLIT_KEYS;

    // A task handles `hpt` consecutive query heads sharing one kv head, so
    // that each key and value row is loaded once for all of them. Split the
    // groups further only when that is needed to give every thread work.
    let mut hpt = group;
    if parallel && !split {
        for d in 1..=group {
            if group.is_multiple_of(d) {
                hpt = group / d;
                if n_q * n_kv_heads * d >= 4 * threads {
                    break;
                }
            }
        }
    }
    let tasks_per_row = n_heads / hpt;

    let ctx = Task {
        q,
        k,
        v,
        past,
        q_stride,
        head_dim,
        hpt,
        group,
        n_kv_heads,
        tasks_per_row,
        scale: shape.scale,
        window,
    };
    #[cfg(target_arch = "x86_64")]
    if split {
        decode_split(&ctx, out, pool, parallel);
        return;
    }
    let task = |scratch: &mut DecodeScratch, (idx, o): (usize, &mut [f32])| {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2, FMA and F16C were detected just above.
            unsafe { simd::task(&ctx, scratch, idx, o) };
            return;
        }
        ctx.run(scratch, idx, o, softmax_in_place);
    };

    if parallel {
        pool.install(|| {
            out.par_chunks_mut(hpt * head_dim)
                .enumerate()
                .for_each_init(DecodeScratch::default, task)
        });
    } else {
        let mut scratch = DecodeScratch::default();
        for item in out.chunks_mut(hpt * head_dim).enumerate() {
            task(&mut scratch, item);
        }
    }
}

/// Keys per part of a long decode (see [`decode_split`]). Parts of 256
/// keys against 1024: SmolLM2 Q4_1 decoded 1.15x faster after 1024 tokens
/// (three parts of 1024 keys on two threads left one idle a third of the
/// time) and 1.05x after 512 (where each query head's task had read its
/// kv head's keys and values again); 128 was no better.
#[cfg(target_arch = "x86_64")]
const PART_KEYS: usize = 256;

/// Visible keys above which a single query is split into parts (see
/// [`decode_split`]); fewer are too little work to share.
const MIN_SPLIT_KEYS: usize = 32;

/// Keys per part of a decode over `len` visible keys: [`PART_KEYS`], or
/// half of them (rounded up to 8) when that makes at most two parts.
/// Decodes over at most 256 keys used to run a task per kv head, or per
/// query head where that gave the threads more tasks, each reading its kv
/// head's slice of every row (each row three times for SmolLM2's nine
/// heads over three kv heads); in two parts SmolLM2's
/// attention ops took 0.82x the time over a 128-token decode and 0.85x
/// after 200 tokens (medians of 8 and 6 alternated runs).
#[cfg(target_arch = "x86_64")]
fn part_keys(len: usize) -> usize {
    if len > 2 * PART_KEYS {
        PART_KEYS
    } else {
        len.div_ceil(2).next_multiple_of(8)
    }
}

/// A single query over more than [`MIN_SPLIT_KEYS`] keys, on AVX2 with
/// heads of a multiple of 64: every part of [`part_keys`] keys is a work
/// item (in `pool` when `parallel`) giving, for every kv head, each of its query
/// heads' partial maximum, sum and weighted values; the parts are then
/// combined in order. A part reads its rows of the cache front to back
/// (see `simd::part`), where one item per (kv head, part) read one head's
/// slice of every row from memory: with that and the key scores' loops
/// inlined (`simd::inline_array`), SmolLM2 Q4_1 decoded 1.05-1.10x faster
/// after 1024 tokens on a Zen 3, 1.16x after 2048, 1.46x after 4096. The
/// parts depend only on the number of visible keys, so the result does
/// not depend on the threads or on other sequences.
#[cfg(target_arch = "x86_64")]
fn decode_split(ctx: &Task<'_>, out: &mut [f32], pool: &ThreadPool, parallel: bool) {
    let (hd, hpt) = (ctx.head_dim, ctx.hpt);
    let tasks = ctx.tasks_per_row;
    let len = ctx.span(0).len;
    let part_keys = part_keys(len);
    let parts = len.div_ceil(part_keys);
    let item = ctx.part_len();
    let mut partial = vec![0.0f32; tasks * parts * item];
    let run = |scratch: &mut DecodeScratch, (p, o): (usize, &mut [f32])| {
        let keys = p * part_keys..((p + 1) * part_keys).min(len);
        // SAFETY: the caller checked AVX2, FMA and F16C.
        unsafe { simd::part(ctx, scratch, keys, o) };
    };
    if parallel {
        pool.install(|| {
            partial
                .par_chunks_mut(tasks * item)
                .enumerate()
                .for_each_init(DecodeScratch::default, run)
        });
    } else {
        let mut scratch = DecodeScratch::default();
        partial
            .chunks_mut(tasks * item)
            .enumerate()
            .for_each(|x| run(&mut scratch, x));
    }
    for (idx, o) in out.chunks_exact_mut(hpt * hd).enumerate() {
        for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
            // Head `h`'s maximum, sum and weighted values in part `p`.
            let part = |p: usize| {
                let it = &partial[(p * tasks + idx) * item..][..item];
                (it[h], it[hpt + h], &it[2 * hpt + h * hd..][..hd])
            };
            let max = (0..parts)
                .map(|p| part(p).0)
                .fold(f32::NEG_INFINITY, f32::max);
            oh.fill(0.0);
            let mut sum = 0.0f32;
            for p in 0..parts {
                let (m, l, acc) = part(p);
                let w = (m - max).exp();
                sum += l * w;
                for (x, a) in oh.iter_mut().zip(acc) {
                    *x += a * w;
                }
            }
            let inv = 1.0 / sum;
            for x in oh.iter_mut() {
                *x *= inv;
            }
        }
    }
}

/// Keys (or values) a decode task decodes at a time.
const TILE_KEYS: usize = 64;

/// The buffers of one decode thread.
#[derive(Default)]
struct DecodeScratch {
    /// Scores, then probabilities, `[hpt][len]`.
    scores: Vec<f32>,
    /// One decoded tile of keys or values (unused for an f32 cache).
    tile: Vec<f32>,
}

/// Everything one attention task reads.
struct Task<'a> {
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
    past: usize,
    q_stride: usize,
    head_dim: usize,
    hpt: usize,
    group: usize,
    n_kv_heads: usize,
    tasks_per_row: usize,
    scale: f32,
    window: Option<usize>,
}

/// What task `idx` reads: its `hpt` query heads, its kv head and the
/// positions of the keys it sees.
struct Span<'a> {
    /// The task's query heads, `hpt · head_dim` values.
    qrow: &'a [f32],
    /// The kv head they share.
    kvh: usize,
    /// First visible key position.
    lo: usize,
    /// Number of visible keys (positions `lo..lo + len`).
    len: usize,
}

impl<'a> Task<'a> {
    /// Values one task's share of a split decode part holds (see
    /// `simd::part`): `hpt` maxima, `hpt` sums, `hpt × head_dim` values.
    #[cfg(target_arch = "x86_64")]
    fn part_len(&self) -> usize {
        self.hpt * (self.head_dim + 2)
    }

    /// The query heads, kv head and visible keys of task `idx`: query
    /// `idx / tasks_per_row`, `hpt` heads of one kv head.
    #[inline(always)]
    fn span(&self, idx: usize) -> Span<'a> {
        let i = idx / self.tasks_per_row;
        let h0 = (idx % self.tasks_per_row) * self.hpt;
        let p = self.past + i;
        let lo = self.window.map_or(0, |w| (p + 1).saturating_sub(w));
        Span {
            qrow: &self.q[i * self.q_stride + h0 * self.head_dim..][..self.hpt * self.head_dim],
            kvh: (h0 / self.group).min(self.n_kv_heads - 1),
            lo,
            len: p + 1 - lo,
        }
    }

    /// Task `idx` (see [`Task::span`]), written to `o`; `softmax`
    /// normalizes one row of scores in place.
    #[inline(always)]
    fn run(
        &self,
        scratch: &mut DecodeScratch,
        idx: usize,
        o: &mut [f32],
        softmax: impl Fn(&mut [f32]),
    ) {
        let Span { qrow, kvh, lo, len } = self.span(idx);
        let (hd, off) = (self.head_dim, kvh * self.head_dim);
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(self.hpt * len, 0.0);
        for t0 in (0..len).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(len);
            let keys = self.k.head_tile(lo + t0..lo + t1, off, hd, buf);
            for jj in t0..t1 {
                let krow = keys.row(jj - t0, hd);
                for (hh, qh) in qrow.chunks_exact(hd).enumerate() {
                    scores[hh * len + jj] = dot(qh, krow) * self.scale;
                }
            }
        }
        for row in scores.chunks_exact_mut(len) {
            softmax(row);
        }
        o.fill(0.0);
        for t0 in (0..len).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(len);
            let values = self.v.head_tile(lo + t0..lo + t1, off, hd, buf);
            for jj in t0..t1 {
                let vrow = values.row(jj - t0, hd);
                for (hh, oh) in o.chunks_exact_mut(hd).enumerate() {
                    axpy(scores[hh * len + jj], vrow, oh);
                }
            }
        }
    }
}

/// The attention task compiled for AVX2 + FMA + F16C with a vectorized
/// softmax: for head dimensions that are multiples of 64, the scores and
/// weighted values of [`multi_head`] (up to three query heads per pass
/// over the rows); otherwise `Task::run` (whose portable dot and axpy loops
/// vectorize 8 wide).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::super::multi_head;
    use super::{DecodeScratch, Span, Task, TILE_KEYS};
    use crate::cpu::kernels::kv_rows::InPlace;

    /// Runs task `idx` (see `Task::run`), one tile of keys (then values)
    /// at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn task(ctx: &Task<'_>, scratch: &mut DecodeScratch, idx: usize, o: &mut [f32]) {
        let hd = ctx.head_dim;
        if !hd.is_multiple_of(64) {
            ctx.run(scratch, idx, o, |row| softmax(row));
            return;
        }
        let span = ctx.span(idx);
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(ctx.hpt * span.len, 0.0);
        score_keys(ctx, &span, 0..span.len, scores, buf);
        for row in scores.chunks_exact_mut(span.len) {
            softmax(row);
        }
        o.fill(0.0);
        add_values(ctx, &span, 0..span.len, scores, buf, o);
    }

    /// One part of a split decode (see `super::decode_split`): over the
    /// visible keys `part`, for every task (kv head), each of its heads'
    /// largest score, its sum of `exp(score − max)` and the values
    /// weighted by those exponentials, written to `out` task after task as
    /// `[max; hpt]`, `[sum; hpt]`, then `[hpt][hd]` weighted values. The
    /// head dimension is a multiple of 64.
    ///
    /// The tasks take turns tile by tile, so the part's key rows, then its
    /// value rows, are read front to back once, whole rows at a time:
    /// task by task, each would read one head's slice of every row, a
    /// stride the prefetchers do not follow, from memory (a decode step's
    /// weights have pushed the cache out of the caches). Each tile's rows
    /// are first streamed in whole (`KvRows::stream_rows`): SmolLM2's
    /// attention ops then took 0.68x the time after 1024 tokens (its whole
    /// decode 1.19x as fast) and the 1.1B model's 0.58x.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn part(
        ctx: &Task<'_>,
        scratch: &mut DecodeScratch,
        part: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let (hpt, tasks) = (ctx.hpt, ctx.tasks_per_row);
        let n = part.len();
        let item = ctx.part_len();
        let DecodeScratch { scores, tile: buf } = scratch;
        scores.clear();
        scores.resize(tasks * hpt * n, 0.0);
        // Task `idx`'s view of the part; its scores are laid out `[hpt][n]`.
        let local = |idx: usize| {
            let span = ctx.span(idx);
            Span {
                lo: span.lo + part.start,
                len: n,
                ..span
            }
        };
        let lo = local(0).lo;
        for t0 in (0..n).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(n);
            ctx.k.stream_rows(lo + t0..lo + t1);
            for (idx, task_scores) in scores.chunks_exact_mut(hpt * n).enumerate() {
                score_keys(ctx, &local(idx), t0..t1, task_scores, buf);
            }
        }
        for (task_scores, o) in scores
            .chunks_exact_mut(hpt * n)
            .zip(out.chunks_exact_mut(item))
        {
            let (maxes, rest) = o.split_at_mut(hpt);
            let (sums, acc) = rest.split_at_mut(hpt);
            for ((row, max), sum) in task_scores.chunks_exact_mut(n).zip(maxes).zip(sums) {
                *max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                *sum = exp_sum(row, *max);
            }
            acc.fill(0.0);
        }
        for t0 in (0..n).step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(n);
            ctx.v.stream_rows(lo + t0..lo + t1);
            for (idx, (probs, o)) in scores
                .chunks_exact(hpt * n)
                .zip(out.chunks_exact_mut(item))
                .enumerate()
            {
                add_values(ctx, &local(idx), t0..t1, probs, buf, &mut o[2 * hpt..]);
            }
        }
    }

    /// `scores[h * span.len + j] = scale · q_h · k_j` for the keys `keys`
    /// (relative to `span.lo`) of the task's heads: f32 and f16 rows read
    /// in place, other types one decoded tile at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn score_keys(
        ctx: &Task<'_>,
        span: &Span<'_>,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        buf: &mut Vec<f32>,
    ) {
        let (hd, len, scale) = (ctx.head_dim, span.len, ctx.scale);
        let off = span.kvh * hd;
        let q = span.qrow;
        let rows = span.lo + keys.start..span.lo + keys.end;
        if let Some(runs) = ctx.k.in_place(rows, off) {
            for (run, tile) in runs {
                let (n, j0) = (run.len(), run.start - span.lo);
                match tile {
                    InPlace::F32(t) => multi_head::scores(q, hd, t, n, scale, scores, len, j0),
                    InPlace::F16(t) => multi_head::scores(q, hd, t, n, scale, scores, len, j0),
                }
            }
            return;
        }
        for t0 in keys.clone().step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(keys.end);
            let tile = ctx.k.head_tile(span.lo + t0..span.lo + t1, off, hd, buf);
            multi_head::scores(q, hd, tile, t1 - t0, scale, scores, len, t0);
        }
    }

    /// `o_h += Σ_j probs[h * span.len + j] · v_j` over the keys `keys`
    /// (relative to `span.lo`): f32 and f16 rows read in place, other types
    /// one decoded tile at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn add_values(
        ctx: &Task<'_>,
        span: &Span<'_>,
        keys: std::ops::Range<usize>,
        probs: &[f32],
        buf: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let (hd, len) = (ctx.head_dim, span.len);
        let off = span.kvh * hd;
        let rows = span.lo + keys.start..span.lo + keys.end;
        if let Some(runs) = ctx.v.in_place(rows, off) {
            for (run, tile) in runs {
                let (n, j0) = (run.len(), run.start - span.lo);
                match tile {
                    InPlace::F32(t) => multi_head::add_values(probs, len, j0, t, n, o, hd),
                    InPlace::F16(t) => multi_head::add_values(probs, len, j0, t, n, o, hd),
                }
            }
            return;
        }
        for t0 in keys.clone().step_by(TILE_KEYS) {
            let t1 = (t0 + TILE_KEYS).min(keys.end);
            let values = ctx.v.head_tile(span.lo + t0..span.lo + t1, off, hd, buf);
            multi_head::add_values(probs, len, t0, values, t1 - t0, o, hd);
        }
    }

    pub(super) use crate::cpu::kernels::simd::vmath::exp8;

    /// Numerically stable softmax of one row, in place, with [`exp8`]
    /// (the row must not be all `-inf`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax(row: &mut [f32]) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let inv = 1.0 / exp_sum(row, max);
        for v in row.iter_mut() {
            *v *= inv;
        }
    }

    /// Replaces every `x` of `row` by `exp(x − max)` ([`exp8`]) and returns
    /// their sum (`max` finite).
    #[target_feature(enable = "avx2,fma")]
    fn exp_sum(row: &mut [f32], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds 8 floats; `loadu`/`storeu` have no
            // alignment requirement.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
                _mm256_storeu_ps(c.as_mut_ptr(), e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        let tail = chunks.into_remainder();
        let mut buf = [f32::NEG_INFINITY; 8];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds 8 floats; `loadu`/`storeu` have no alignment
        // requirement.
        unsafe {
            // Padding lanes are -inf: exp8 clamps them to e^-88 − keep them
            // out of the sum by zeroing after the call.
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
        }
        buf[tail.len()..].fill(0.0);
        tail.copy_from_slice(&buf[..tail.len()]);
        let mut s = [0.0f32; 8];
        // SAFETY: `s` holds 8 floats.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), sum) };
        s.iter().sum::<f32>() + buf.iter().sum::<f32>()
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::kernels::test_util::Rng;

    /// The AVX2 softmax agrees with the portable one within 1e-6 of each
    /// probability (plus relative 1e-5), on rows with tails and large ranges.
    #[test]
    fn simd_softmax_matches_scalar() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("skipping: no AVX2/FMA");
            return;
        }
        let mut rng = Rng::new(41);
        for n in [1, 5, 8, 13, 64, 257] {
            for spread in [0.1, 5.0, 60.0] {
                let x = rng.vec(n, spread);
                let mut want = x.clone();
                softmax_in_place(&mut want);
                let mut got = x;
                // SAFETY: AVX2 and FMA were detected above.
                unsafe { simd::softmax(&mut got) };
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-6 + 1e-5 * w.abs(), "n={n}: {g} vs {w}");
                }
            }
        }
        // exp8 over a range of arguments: relative error below 1e-6.
        for i in 0..=200 {
            let x = -87.0 + i as f32 * 0.435;
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; `out` holds 8 floats.
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(out.as_mut_ptr(), simd::exp8(_mm256_set1_ps(x)));
            }
            let want = (x as f64).exp();
            assert!(
                ((out[0] as f64 - want) / want).abs() < 1e-6,
                "exp({x}) = {}",
                out[0]
            );
        }
    }
}
