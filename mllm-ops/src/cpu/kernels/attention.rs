//! Causal scaled-dot-product attention of one sequence over its KV cache:
//! steps of several queries through the tiled kernels (`tiled`), one query
//! (a decode step) through its own tasks (`decode`).

use rayon::prelude::*;
use rayon::ThreadPool;

use super::kv_rows::KvRows;
use super::qkernel::SimdLevel;
use super::PAR_THRESHOLD;

mod decode;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod multi_head;
#[cfg(test)]
mod tests;
mod tiled;

/// Head layout and masking parameters of [`attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (divides `n_heads`; fewer for GQA/MQA).
    pub n_kv_heads: usize,
    /// Dimension of every head.
    pub head_dim: usize,
    /// Multiplier of `q·k`, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// With `Some(w)`, a query at position `p` sees only keys at positions
    /// `p - w < j <= p` (itself and the `w - 1` previous tokens, as
    /// transformers' sliding-window attention).
    pub sliding_window: Option<usize>,
}

/// Causal attention for the `n_q` query tokens at absolute positions
/// `past..past + n_q` of one sequence.
///
/// * `q` is `[n_q, n_heads * head_dim]`;
/// * `k` and `v` are `[kv_len, n_kv_heads * head_dim]` with
///   `kv_len >= past + n_q`: the whole cache, where rows `0..past + n_q` are
///   valid (rows beyond are ignored);
/// * `out` is `[n_q, n_heads * head_dim]`.
///
/// Query `i` (position `p = past + i`) of head `h` attends to the keys of
/// kv head `h / (n_heads / n_kv_heads)` at positions `j <= p` (and `j > p - w`
/// with a sliding window `w`): `out = softmax(scale · q·kᵀ) · v`, in f32 with
/// max subtraction. Runs in `pool` unless the work is tiny.
///
/// Steps of more than one query (prefill) run the tiled kernel of
/// `tiled`: blocks of queries against blocks of keys with an online
/// softmax. Single-query steps (decode) score one query at a time, split
/// over (query, head-group) pairs (the query heads of one kv head are
/// processed together so that every key and value row is read once per
/// group).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    n_q: usize,
    past: usize,
    k: &[f32],
    v: &[f32],
    shape: &AttnShape,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let row_len = shape.n_kv_heads * shape.head_dim;
    if row_len == 0 {
        return;
    }
    let seq = SeqAttention {
        q,
        n_q,
        past,
        k: KvRows::f32(k, row_len),
        v: KvRows::f32(v, row_len),
    };
    attention_of(&seq, shape, out, pool, true, SimdLevel::FASTEST_FIRST[0]);
}

/// One sequence of an [`attention_batch`] call: its queries, their count,
/// the tokens before them and its KV cache (as for [`attention`], in any
/// storage type).
#[derive(Clone, Copy)]
pub struct SeqAttention<'a> {
    /// `[n_q, n_heads * head_dim]` queries.
    pub q: &'a [f32],
    /// Number of queries.
    pub n_q: usize,
    /// Position of the first query (tokens already cached).
    pub past: usize,
    /// The sequence's cached keys, at least `past + n_q` rows.
    pub k: KvRows<'a>,
    /// The sequence's cached values, at least `past + n_q` rows.
    pub v: KvRows<'a>,
}

impl SeqAttention<'_> {
    /// Query-key pairs scored (the work, up to the head count).
    fn pairs(&self) -> usize {
        self.n_q * (self.past + self.n_q)
    }
}

/// [`attention`] of several sequences, `outs[i]` for `seqs[i]`: when no
/// sequence holds half the work (decode steps of many sequences), the
/// sequences run in parallel, each on one thread, instead of splitting each
/// small one over the pool in turn; otherwise one after another. Every
/// output equals that of an [`attention`] call for its sequence alone.
/// The kernels use at most the SIMD level `max` (as
/// `QuantKernel::capped`: `Avx2` runs what an AVX2-only CPU runs).
pub fn attention_batch(
    seqs: &[SeqAttention<'_>],
    shape: &AttnShape,
    outs: Vec<&mut [f32]>,
    pool: &ThreadPool,
    max: SimdLevel,
) {
    debug_assert_eq!(seqs.len(), outs.len(), "one output per sequence");
    let total: usize = seqs.iter().map(SeqAttention::pairs).sum();
    let largest = seqs.iter().map(SeqAttention::pairs).max().unwrap_or(0);
    if seqs.len() > 1 && pool.current_num_threads() > 1 && 2 * largest < total {
        pool.install(|| {
            seqs.par_iter()
                .zip(outs)
                .for_each(|(seq, out)| attention_of(seq, shape, out, pool, false, max))
        });
        return;
    }
    for (seq, out) in seqs.iter().zip(outs) {
        attention_of(seq, shape, out, pool, true, max);
    }
}

/// [`attention`] of one sequence, split over `pool` only when `may_split`
/// and the work is large enough (the split never changes the results),
/// with SIMD levels up to `max`.
fn attention_of(
    seq: &SeqAttention<'_>,
    shape: &AttnShape,
    out: &mut [f32],
    pool: &ThreadPool,
    may_split: bool,
    // Only x86-64 has attention kernels beyond the portable ones.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] max: SimdLevel,
) {
    let SeqAttention { q, n_q, past, k, v } = *seq;
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        sliding_window,
        ..
    } = *shape;
    let q_stride = n_heads * head_dim;
    let kv_stride = n_kv_heads * head_dim;
    debug_assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "n_kv_heads must divide n_heads"
    );
    debug_assert_eq!(
        q.len(),
        n_q * q_stride,
        "q must be [n_q, n_heads * head_dim]"
    );
    debug_assert_eq!(
        out.len(),
        n_q * q_stride,
        "out must be [n_q, n_heads * head_dim]"
    );
    debug_assert!(
        k.rows() >= past + n_q && k.row_len() == kv_stride,
        "k must hold past + n_q rows of n_kv_heads * head_dim"
    );
    debug_assert!(
        v.rows() >= past + n_q && v.row_len() == kv_stride,
        "v must hold past + n_q rows of n_kv_heads * head_dim"
    );
    debug_assert!(
        head_dim.is_multiple_of(k.kind().block_len())
            && head_dim.is_multiple_of(v.kind().block_len()),
        "heads must be whole blocks of the cache type"
    );
    debug_assert!(
        sliding_window != Some(0),
        "a sliding window must be at least 1"
    );
    if n_q == 0 || n_heads == 0 || head_dim == 0 || n_kv_heads == 0 {
        return;
    }
    let window = sliding_window.map(|w| w.max(1));
    // First visible key position for the query at position `p`.
    let first_key = move |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));

    // Work estimate: two multiply-adds per (query, head, visible key, dim).
    let visible: usize = (0..n_q).map(|i| past + i + 1 - first_key(past + i)).sum();
    let work = visible
        .saturating_mul(n_heads)
        .saturating_mul(head_dim)
        .saturating_mul(2);
    let threads = pool.current_num_threads().max(1);
    let parallel = may_split && threads > 1 && work >= PAR_THRESHOLD;

    if use_tiled(n_q, past) {
        let tiled = tiled::Tiled::new(q, n_q, past, k, v, shape);
        #[cfg(target_arch = "x86_64")]
        if let Some(ops) = tiled::Avx512::detect().filter(|_| SimdLevel::Avx512.at_most(max)) {
            tiled.run(ops, out, pool, parallel);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(ops) = tiled::Avx2::detect().filter(|_| SimdLevel::Avx2.at_most(max)) {
            tiled.run(ops, out, pool, parallel);
            return;
        }
        tiled.run(tiled::Scalar, out, pool, parallel);
        return;
    }

    decode::run(seq, shape, out, pool, parallel, visible, max);
}

/// Whether a step of `n_q` queries after `past` cached tokens takes the
/// tiled kernel: every step of more than one query does (positions must fit
/// `i32`). A query's tiled result depends only on its position, its values
/// and the keys (see [`tiled`]), so a prompt gives the same bits however it
/// is cut into chunks, which prefix reuse in a server relies on.
fn use_tiled(n_q: usize, past: usize) -> bool {
    n_q > 1 && past + n_q <= i32::MAX as usize
}
