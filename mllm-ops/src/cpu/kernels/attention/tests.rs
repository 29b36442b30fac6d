use super::*;
use crate::cpu::kernels::test_util::{assert_close, bits, pool1, pool2, Rng};

/// No cap on the SIMD level.
const FASTEST: SimdLevel = SimdLevel::FASTEST_FIRST[0];

/// `n_heads` query heads over `n_kv_heads` of `head_dim`, scaled by
/// `1/√head_dim`, with a sliding `window` or none.
fn shape(n_heads: usize, n_kv_heads: usize, head_dim: usize, window: Option<usize>) -> AttnShape {
    AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: window,
    }
}

/// Random queries (`n_q` rows, spread 2), keys (`kv_len` rows, spread
/// 2) and values (`kv_len` rows, spread 1) for `s`, drawn in that order.
fn random_qkv(
    rng: &mut Rng,
    s: &AttnShape,
    n_q: usize,
    kv_len: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let kv_row = s.n_kv_heads * s.head_dim;
    let q = rng.vec(n_q * s.n_heads * s.head_dim, 2.0);
    let k = rng.vec(kv_len * kv_row, 2.0);
    let v = rng.vec(kv_len * kv_row, 1.0);
    (q, k, v)
}

/// Naive f64 reference over the whole prefix.
fn reference(q: &[f32], n_q: usize, past: usize, k: &[f32], v: &[f32], s: &AttnShape) -> Vec<f64> {
    let (hd, nh, nkv) = (s.head_dim, s.n_heads, s.n_kv_heads);
    let mut out = vec![0.0f64; n_q * nh * hd];
    for i in 0..n_q {
        let p = past + i;
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let keys: Vec<usize> = (0..=p)
                .filter(|&j| s.sliding_window.is_none_or(|w| j + w > p))
                .collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    (0..hd)
                        .map(|d| {
                            q[i * nh * hd + h * hd + d] as f64
                                * k[j * nkv * hd + kvh * hd + d] as f64
                        })
                        .sum::<f64>()
                        * s.scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                out[i * nh * hd + h * hd + d] = keys
                    .iter()
                    .zip(&e)
                    .map(|(&j, &w)| w / z * v[j * nkv * hd + kvh * hd + d] as f64)
                    .sum();
            }
        }
    }
    out
}

// Tolerance for all tests here: |got - want| <= 1e-5 + 1e-5 |want|.
const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-5;

#[test]
fn attention_matches_reference() {
    let mut rng = Rng::new(61);
    let pools = [pool1(), pool2()];
    // (n_heads, n_kv_heads, head_dim): MHA, GQA, MQA, odd head dims,
    // and multiples of 64 (the AVX2 multi-head task).
    let heads = [
        (2, 2, 8),
        (4, 2, 7),
        (6, 3, 33),
        (3, 1, 16),
        (8, 1, 64),
        (9, 3, 64),
        (2, 1, 128),
    ];
    // (n_q, past): prefill, decode, chunked prefill.
    let steps = [(1, 0), (5, 0), (1, 9), (3, 4), (17, 20), (40, 0), (1, 40)];
    for pool in &pools {
        for &(n_heads, n_kv_heads, head_dim) in &heads {
            for &(n_q, past) in &steps {
                for window in [None, Some(1), Some(3), Some(16), Some(1000)] {
                    let s = shape(n_heads, n_kv_heads, head_dim, window);
                    // Cache with 2 spare (garbage) rows beyond past + n_q.
                    let kv_len = past + n_q + 2;
                    let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
                    let mut out = vec![f32::NAN; q.len()];
                    attention(&q, n_q, past, &k, &v, &s, &mut out, pool);
                    let want = reference(&q, n_q, past, &k, &v, &s);
                    assert_close(&out, &want, ATOL, RTOL);
                }
            }
        }
    }
}

/// Runs the tiled kernel with `ops` (`parallel` in `pool`).
#[allow(clippy::too_many_arguments)]
fn run_tiled<O: tiled::TileOps>(
    ops: O,
    q: &[f32],
    n_q: usize,
    past: usize,
    k: &[f32],
    v: &[f32],
    s: &AttnShape,
    pool: &ThreadPool,
    parallel: bool,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; q.len()];
    let row_len = s.n_kv_heads * s.head_dim;
    let (k, v) = (KvRows::f32(k, row_len), KvRows::f32(v, row_len));
    tiled::Tiled::new(q, n_q, past, k, v, s).run(ops, &mut out, pool, parallel);
    out
}

/// Checks the tiled kernel with `ops` against the f64 reference, serial
/// and on two threads: 1 to 100 queries after a cached prefix, GQA
/// (9 / 3 heads of 64), MHA, group sizes that do not divide a panel,
/// head dims that are not a multiple of 4 or 8, sliding windows
/// smaller and larger than a key block.
fn check_tiled<O: tiled::TileOps>(ops: O) {
    let mut rng = Rng::new(64);
    let (p1, p2) = (pool1(), pool2());
    let heads = [(9, 3, 64), (4, 4, 16), (5, 1, 20), (6, 2, 7)];
    let steps = [(1, 3), (2, 0), (7, 5), (24, 1), (37, 70), (100, 13)];
    for &(n_heads, n_kv_heads, head_dim) in &heads {
        for &(n_q, past) in &steps {
            for window in [None, Some(1), Some(5), Some(90)] {
                let s = shape(n_heads, n_kv_heads, head_dim, window);
                let kv_len = past + n_q + 3;
                let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
                let want = reference(&q, n_q, past, &k, &v, &s);
                let serial = run_tiled(ops, &q, n_q, past, &k, &v, &s, &p1, false);
                assert_close(&serial, &want, ATOL, RTOL);
                let par = run_tiled(ops, &q, n_q, past, &k, &v, &s, &p2, true);
                assert_close(&par, &want, ATOL, RTOL);
            }
        }
    }
}

#[test]
fn tiled_scalar_matches_reference() {
    check_tiled(tiled::Scalar);
}

/// Runs `check` with each vector [`tiled::TileOps`] this CPU has (the
/// AVX2 and the AVX-512 tiles), saying which it skips.
#[cfg(target_arch = "x86_64")]
fn each_vector_tile_ops(check_avx2: impl Fn(tiled::Avx2), check_avx512: impl Fn(tiled::Avx512)) {
    match tiled::Avx2::detect() {
        Some(ops) => check_avx2(ops),
        None => eprintln!("skipping AVX2: no AVX2/FMA"),
    }
    match tiled::Avx512::detect() {
        Some(ops) => check_avx512(ops),
        None => eprintln!("skipping AVX-512: no AVX-512F"),
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn tiled_vector_kernels_match_reference() {
    each_vector_tile_ops(check_tiled, check_tiled);
}

/// A capped call runs the capped level's kernels: a prefill capped at
/// AVX2 gives the AVX2 tiles' bits, capped at scalar the portable
/// tiles' bits, and a capped decode the reference's values.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_simd_cap_picks_the_kernels() {
    let Some(avx2) = tiled::Avx2::detect() else {
        eprintln!("skipping: no AVX2/FMA");
        return;
    };
    let mut rng = Rng::new(68);
    let s = SMOLLM2_SHAPE;
    let width = s.n_heads * s.head_dim;
    let row_len = s.n_kv_heads * s.head_dim;
    let (n_q, past) = (40, 30);
    let q = rng.vec(n_q * width, 2.0);
    let k = rng.vec((past + n_q) * row_len, 2.0);
    let v = rng.vec((past + n_q) * row_len, 1.0);
    let pool = pool2();
    let capped = |n_q: usize, past: usize, max: SimdLevel| {
        let seq = SeqAttention {
            q: &q[..n_q * width],
            n_q,
            past,
            k: KvRows::f32(&k, row_len),
            v: KvRows::f32(&v, row_len),
        };
        let mut out = vec![f32::NAN; n_q * width];
        attention_batch(&[seq], &s, vec![&mut out[..]], &pool, max);
        out
    };
    let tiled_at = |ops| run_tiled(ops, &q, n_q, past, &k, &v, &s, &pool, true);
    assert_eq!(
        bits(&capped(n_q, past, SimdLevel::Avx2)),
        bits(&tiled_at(avx2))
    );
    let scalar = run_tiled(tiled::Scalar, &q, n_q, past, &k, &v, &s, &pool, true);
    assert_eq!(bits(&capped(n_q, past, SimdLevel::Scalar)), bits(&scalar));
    let want = reference(&q[..width], 1, past + n_q - 1, &k, &v, &s);
    for max in [SimdLevel::Scalar, SimdLevel::Avx2] {
        assert_close(&capped(1, past + n_q - 1, max), &want, ATOL, RTOL);
    }
}

/// The AVX-512 kernel (panels of 32 rows, tiles of eight keys or head
/// dimensions) gives the AVX2 one's bits (panels of 24 rows, tiles of
/// three): head dims that fill whole tiles of both, of one, and of
/// neither, row counts that fill neither kind of panel, with and
/// without a window, serial and on two threads.
#[cfg(target_arch = "x86_64")]
#[test]
fn tiled_avx512_equals_avx2_bit_for_bit() {
    let (Some(wide), Some(narrow)) = (tiled::Avx512::detect(), tiled::Avx2::detect()) else {
        eprintln!("skipping: no AVX-512F");
        return;
    };
    let mut rng = Rng::new(67);
    let (p1, p2) = (pool1(), pool2());
    for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (4, 4, 24), (6, 2, 7), (2, 1, 40)] {
        for (n_q, past, window) in [(1, 0, None), (37, 70, None), (100, 13, Some(9))] {
            let s = shape(n_heads, n_kv_heads, head_dim, window);
            let kv_len = past + n_q;
            let (q, k, v) = random_qkv(&mut rng, &s, n_q, kv_len);
            for (pool, parallel) in [(&p1, false), (&p2, true)] {
                let a = run_tiled(wide, &q, n_q, past, &k, &v, &s, pool, parallel);
                let b = run_tiled(narrow, &q, n_q, past, &k, &v, &s, pool, parallel);
                let what = format!("heads {n_heads}/{n_kv_heads}x{head_dim}, {n_q} after {past}");
                assert_eq!(
                    bits(&a),
                    bits(&b),
                    "{what}, window {window:?}, parallel {parallel}"
                );
            }
        }
    }
}

/// Checks with `ops` that the tiled kernel gives each query the same bits
/// however the prompt is cut into chunks: the queries `r..n` run as one
/// chunk after `r` cached tokens equal rows `r..n` of the whole prompt,
/// for cuts inside and at the edges of key blocks and panels, GQA and
/// MHA, with and without a sliding window.
fn check_tiled_chunking<O: tiled::TileOps>(ops: O) {
    let mut rng = Rng::new(66);
    let pool = pool1();
    let n = 150;
    for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (4, 4, 16), (6, 2, 7)] {
        for window in [None, Some(5), Some(90)] {
            let s = shape(n_heads, n_kv_heads, head_dim, window);
            let width = n_heads * head_dim;
            let (q, k, v) = random_qkv(&mut rng, &s, n, n);
            let whole = run_tiled(ops, &q, n, 0, &k, &v, &s, &pool, false);
            for r in [1, 7, 30, 63, 64, 65, 100, 148] {
                let part = run_tiled(ops, &q[r * width..], n - r, r, &k, &v, &s, &pool, false);
                let same = part
                    .iter()
                    .zip(&whole[r * width..])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "cut at {r}, heads {n_heads}/{n_kv_heads}, window {window:?}"
                );
            }
        }
    }
}

#[test]
fn tiled_scalar_results_do_not_depend_on_the_chunks() {
    check_tiled_chunking(tiled::Scalar);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn tiled_vector_results_do_not_depend_on_the_chunks() {
    each_vector_tile_ops(check_tiled_chunking, check_tiled_chunking);
}

/// SmolLM2-135M's attention: 9 query heads over 3 KV heads of 64.
const SMOLLM2_SHAPE: AttnShape = AttnShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
    scale: 0.125,
    sliding_window: None,
};

/// A long GQA prefill through [`attention`] (tiled, with key blocks
/// cut by the causal diagonal): one and two threads agree with the
/// reference and with each other.
#[test]
fn prefill_threads_agree() {
    let mut rng = Rng::new(65);
    let s = SMOLLM2_SHAPE;
    let (n_q, past) = (150, 20);
    let kv_len = past + n_q;
    let q = rng.vec(n_q * 9 * 64, 2.0);
    let k = rng.vec(kv_len * 3 * 64, 2.0);
    let v = rng.vec(kv_len * 3 * 64, 1.0);
    let want = reference(&q, n_q, past, &k, &v, &s);
    let mut one = vec![f32::NAN; q.len()];
    attention(&q, n_q, past, &k, &v, &s, &mut one, &pool1());
    assert_close(&one, &want, ATOL, RTOL);
    let mut two = vec![f32::NAN; q.len()];
    attention(&q, n_q, past, &k, &v, &s, &mut two, &pool2());
    let one64: Vec<f64> = one.iter().map(|&x| x as f64).collect();
    assert_close(&two, &one64, 1e-6, 1e-6);
}

#[test]
fn incremental_equals_full_sequence() {
    let mut rng = Rng::new(62);
    let pool = pool2();
    for window in [None, Some(5)] {
        let s = AttnShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 20,
            scale: 0.3,
            sliding_window: window,
        };
        let seq = 23;
        let width = s.n_heads * s.head_dim;
        let q = rng.vec(seq * width, 2.0);
        let k = rng.vec(seq * s.n_kv_heads * s.head_dim, 2.0);
        let v = rng.vec(seq * s.n_kv_heads * s.head_dim, 1.0);
        let mut full = vec![0.0f32; seq * width];
        attention(&q, seq, 0, &k, &v, &s, &mut full, &pool);
        // Chunked prefill (7 + 9) then decode one token at a time.
        let mut chunks = vec![(0, 7), (7, 9)];
        chunks.extend((16..seq).map(|p| (p, 1)));
        for (past, n_q) in chunks {
            let mut part = vec![f32::NAN; n_q * width];
            let qs = &q[past * width..(past + n_q) * width];
            attention(qs, n_q, past, &k, &v, &s, &mut part, &pool);
            let want: Vec<f64> = full[past * width..(past + n_q) * width]
                .iter()
                .map(|&x| x as f64)
                .collect();
            // Same arithmetic per (query, head): |diff| <= 1e-6.
            assert_close(&part, &want, 1e-6, 0.0);
        }
    }
}

#[test]
fn large_parallel_matches_reference() {
    let mut rng = Rng::new(63);
    let pool = pool2();
    let s = AttnShape {
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        sliding_window: Some(50),
    };
    let (n_q, past) = (30, 70);
    let kv_len = past + n_q;
    let q = rng.vec(n_q * 8 * 64, 2.0);
    let k = rng.vec(kv_len * 2 * 64, 2.0);
    let v = rng.vec(kv_len * 2 * 64, 1.0);
    let mut out = vec![f32::NAN; q.len()];
    attention(&q, n_q, past, &k, &v, &s, &mut out, &pool);
    assert_close(&out, &reference(&q, n_q, past, &k, &v, &s), ATOL, RTOL);
}

/// Decodes over more than `MIN_SPLIT_KEYS` visible keys (split into
/// parts and combined) agree with the reference, give the same bits on one
/// and two threads and inside a batch, and read encoded caches like f32
/// caches of the decoded values.
#[test]
fn long_decodes_split_into_parts_match_the_reference() {
    use crate::cpu::kernels::kv_rows::{decode_portable, encode};
    use mllm_core::KvDtype;
    let mut rng = Rng::new(68);
    let row = 3 * 64;
    for (past, window) in [
        (40, None),
        (127, None),
        (200, Some(150)),
        (256, None),
        (700, Some(300)),
        (1024, None),
        (1500, None),
        (2600, Some(1100)),
        (3000, Some(900)),
    ] {
        let s = AttnShape {
            sliding_window: window,
            ..SMOLLM2_SHAPE
        };
        let kv_len = past + 1;
        let q = rng.vec(9 * 64, 2.0);
        let (k, v) = (rng.vec(kv_len * row, 2.0), rng.vec(kv_len * row, 1.0));
        let want = reference(&q, 1, past, &k, &v, &s);
        let mut one = vec![f32::NAN; q.len()];
        attention(&q, 1, past, &k, &v, &s, &mut one, &pool1());
        assert_close(&one, &want, ATOL, RTOL);
        let mut two = vec![f32::NAN; q.len()];
        attention(&q, 1, past, &k, &v, &s, &mut two, &pool2());
        assert_eq!(bits(&one), bits(&two), "past {past}");
        // In a batch with a short decode, each sequence serial.
        let short = rng.vec(11 * row, 1.0);
        let seqs = [
            SeqAttention {
                q: &q,
                n_q: 1,
                past,
                k: KvRows::f32(&k, row),
                v: KvRows::f32(&v, row),
            },
            SeqAttention {
                q: &q,
                n_q: 1,
                past: 10,
                k: KvRows::f32(&short, row),
                v: KvRows::f32(&short, row),
            },
        ];
        let mut outs = [vec![f32::NAN; q.len()], vec![f32::NAN; q.len()]];
        let [a, b] = &mut outs;
        attention_batch(&seqs, &s, vec![&mut a[..], &mut b[..]], &pool2(), FASTEST);
        assert_eq!(bits(&outs[0]), bits(&one), "past {past} in a batch");
        // Three long decodes together run one per thread, each serial.
        let three = [seqs[0], seqs[0], seqs[0]];
        let mut outs = [0, 1, 2].map(|_| vec![f32::NAN; q.len()]);
        let [a, b, c] = &mut outs;
        let views = vec![&mut a[..], &mut b[..], &mut c[..]];
        attention_batch(&three, &s, views, &pool2(), FASTEST);
        for o in &outs {
            assert_eq!(bits(o), bits(&one), "past {past}, three in a batch");
        }
        // A q8_0 cache equals an f32 cache of its decoded values.
        let kind = KvDtype::Q8_0;
        let (mut kb, mut vb) = (vec![0u8; kv_len * 204], vec![0u8; kv_len * 204]);
        encode(kind, &k, &mut kb);
        encode(kind, &v, &mut vb);
        let (mut kd, mut vd) = (vec![0f32; k.len()], vec![0f32; v.len()]);
        decode_portable(kind, &kb, &mut kd);
        decode_portable(kind, &vb, &mut vd);
        let mut plain = vec![f32::NAN; q.len()];
        attention(&q, 1, past, &kd, &vd, &s, &mut plain, &pool2());
        let seq = SeqAttention {
            q: &q,
            n_q: 1,
            past,
            k: KvRows::encoded(kind, &kb, row),
            v: KvRows::encoded(kind, &vb, row),
        };
        let mut got = vec![f32::NAN; q.len()];
        attention_batch(&[seq], &s, vec![&mut got[..]], &pool2(), FASTEST);
        assert_eq!(bits(&got), bits(&plain), "past {past} q8_0");
    }
}

/// Attention over a cache stored as f16, Q8_0 or Q4 gives, bit for
/// bit, what it gives over an f32 cache holding the decoded values:
/// decode steps and tiled prefill, with and without a sliding window,
/// on one and two threads.
#[test]
fn encoded_caches_equal_f32_caches_of_their_decoded_values() {
    use crate::cpu::kernels::kv_rows::{decode_portable, encode};
    use mllm_core::KvDtype;
    let mut rng = Rng::new(67);
    let row = 3 * 64;
    for kind in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_1] {
        for (n_q, past) in [(1, 0), (1, 70), (1, 200), (3, 20), (40, 30), (150, 0)] {
            for window in [None, Some(50)] {
                let s = AttnShape {
                    sliding_window: window,
                    ..SMOLLM2_SHAPE
                };
                let kv_len = past + n_q;
                let q = rng.vec(n_q * 9 * 64, 2.0);
                let (k, v) = (rng.vec(kv_len * row, 2.0), rng.vec(kv_len * row, 1.0));
                let enc = |x: &[f32]| {
                    let mut b = vec![0u8; kv_len * kind.row_bytes(row)];
                    encode(kind, x, &mut b);
                    let mut back = vec![0f32; x.len()];
                    decode_portable(kind, &b, &mut back);
                    (b, back)
                };
                let ((kb, kd), (vb, vd)) = (enc(&k), enc(&v));
                for pool in [pool1(), pool2()] {
                    let mut want = vec![f32::NAN; q.len()];
                    attention(&q, n_q, past, &kd, &vd, &s, &mut want, &pool);
                    let seq = SeqAttention {
                        q: &q,
                        n_q,
                        past,
                        k: KvRows::encoded(kind, &kb, row),
                        v: KvRows::encoded(kind, &vb, row),
                    };
                    let mut got = vec![f32::NAN; q.len()];
                    attention_batch(&[seq], &s, vec![&mut got[..]], &pool, FASTEST);
                    assert_eq!(bits(&got), bits(&want), "{kind} n_q {n_q} past {past}");
                }
            }
        }
    }
}

/// A batch of sequences gives each exactly what `attention` gives it
/// alone (split over the pool), both when the sequences run in
/// parallel and when one prefill holds most of the work.
#[test]
fn batch_equals_each_sequence_alone() {
    let mut rng = Rng::new(66);
    let s = SMOLLM2_SHAPE;
    let width = 9 * 64;
    let pool = pool2();
    // Parallel decodes; a tiled chunk among long decodes (parallel);
    // one dominant prefill (one after another).
    for shape in [
        vec![(1, 40), (1, 7), (1, 90), (3, 12), (1, 0)],
        vec![(1, 300), (1, 300), (8, 40), (1, 300)],
        vec![(1, 5), (120, 30), (1, 60)],
    ] {
        let data: Vec<_> = shape
            .iter()
            .map(|&(n_q, past)| {
                let kv = (past + n_q) * 3 * 64;
                (
                    rng.vec(n_q * width, 2.0),
                    rng.vec(kv, 2.0),
                    rng.vec(kv, 1.0),
                )
            })
            .collect();
        let seqs: Vec<SeqAttention<'_>> = shape
            .iter()
            .zip(&data)
            .map(|(&(n_q, past), (q, k, v))| SeqAttention {
                q,
                n_q,
                past,
                k: KvRows::f32(k, 3 * 64),
                v: KvRows::f32(v, 3 * 64),
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = shape
            .iter()
            .map(|&(n, _)| vec![f32::NAN; n * width])
            .collect();
        attention_batch(
            &seqs,
            &s,
            outs.iter_mut().map(|o| &mut o[..]).collect(),
            &pool,
            FASTEST,
        );
        for ((seq, got), (_, k, v)) in seqs.iter().zip(&outs).zip(&data) {
            let mut alone = vec![f32::NAN; got.len()];
            attention(seq.q, seq.n_q, seq.past, k, v, &s, &mut alone, &pool);
            assert_eq!(&alone, got, "{shape:?}: n_q {} past {}", seq.n_q, seq.past);
        }
    }
}
