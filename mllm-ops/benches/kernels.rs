//! Micro-benchmarks of the main CPU kernels at SmolLM2-135M sizes, so that
//! regressions show: quantized matrix-vector products (decode), quantized
//! GEMM (prefill, with 16-bit and with 8-bit activation rows) and
//! attention, plus one decode through a matrix larger than the caches (the
//! memory stream) and a few prefill cases at the 1.1B benchmark model's
//! widths (f16 2048 x 2048, its Q4_K FFN). Every kernel is called from a
//! thread of its pool, as the model's decode steps run.
//!
//! ```text
//! cargo bench -p mllm-ops --bench kernels
//! ```

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use mllm_core::{DType, KvDtype};
use mllm_ops::cpu::kernels::kv_rows::encode;
use mllm_ops::cpu::kernels::matmul::HalfBits;
use mllm_ops::cpu::kernels::{
    attention, attention_batch, packed_half_linear, packed_linear, packed_q4k_linear,
    packed_q5_linear, packed_q6k_linear, packed_q8_linear, quant_linear, ActivationScratch,
    AttnShape, KvRows, PackedHalf, PackedQ4, PackedQ4K, PackedQ5, PackedQ6K, PackedQ8, QuantKernel,
    QuantMatrix, QuantPath, SeqAttention, SimdLevel,
};
use mllm_ops::quant::{quantize, QuantType};

/// The x86-64 kernel levels the benches compare, fastest first (each case
/// runs at those this CPU has).
const X86_LEVELS: [SimdLevel; 3] = [SimdLevel::Avx512, SimdLevel::AvxVnni, SimdLevel::Avx2];

/// Deterministic values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

/// `[out_f, in_f]` weights of `dtype`, activations of `rows` rows.
fn linear_case(dtype: DType, out_f: usize, in_f: usize, rows: usize) -> (Vec<u8>, Vec<f32>) {
    let w = quantize(dtype, &values(out_f * in_f, 1)).expect("quantize");
    (w, values(rows * in_f, 2))
}

fn bench_linear(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let pool = pool(2);
    let mut g = c.benchmark_group("quant_linear");
    // (name, dtype, out_f, in_f, rows): an FFN projection, a key
    // projection and the tied LM head for decode; FFN, key and down
    // projections for a 128-token prefill.
    let cases = [
        ("q4_1 ffn decode", DType::Q4_1, 1536, 576, 1),
        ("q4_1 k_proj decode", DType::Q4_1, 192, 576, 1),
        ("q8_0 lm_head decode", DType::Q8_0, 49152, 576, 1),
        ("q4_1 ffn prefill128", DType::Q4_1, 1536, 576, 128),
        ("q4_1 k_proj prefill128", DType::Q4_1, 192, 576, 128),
        ("q4_1 down prefill128", DType::Q4_1, 576, 1536, 128),
    ];
    for (name, dtype, out_f, in_f, rows) in cases {
        let (w, x) = linear_case(dtype, out_f, in_f, rows);
        let qt = QuantType::from_dtype(dtype).expect("quantized dtype");
        let m = QuantMatrix::new(qt, &w, out_f, in_f).expect("matrix");
        let mut y = vec![0.0f32; rows * out_f];
        g.throughput(Throughput::Elements((rows * out_f * in_f) as u64));
        for path in [
            QuantPath::Int16Activations,
            QuantPath::Int8Activations,
            QuantPath::F32Activations,
        ] {
            let k = QuantKernel::new(path);
            g.bench_function(BenchmarkId::new(name, format!("{path:?}")), |b| {
                pool.install(|| b.iter(|| quant_linear(k, &x, rows, &m, None, &mut y, &pool)))
            });
        }
        let k = QuantKernel::new(QuantPath::Int16Activations);
        if let (true, Ok(p)) = (k.repacks_weights(), PackedQ4::pack(&m)) {
            g.bench_function(BenchmarkId::new(name, "Packed"), |b| {
                pool.install(|| {
                    b.iter(|| packed_linear(k, &x, rows, &p, None, &mut y, &pool, &scratch))
                })
            });
        }
    }
    g.finish();
}

/// SmolLM2-135M's attention: 9 query heads over 3 KV heads of 64.
const SMOLLM2_ATTENTION: AttnShape = AttnShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
    scale: 0.125,
    sliding_window: None,
};

fn bench_attention(c: &mut Criterion) {
    let pool = pool(2);
    let mut g = c.benchmark_group("attention");
    let shape = SMOLLM2_ATTENTION;
    // (name, n_q, past): one decode token after 64 and 512, 128- and
    // 512-token prefills.
    for (name, n_q, past) in [
        ("decode@64", 1, 64),
        ("decode@512", 1, 512),
        ("prefill128", 128, 0),
        ("prefill512", 512, 0),
    ] {
        let kv = past + n_q;
        let q = values(n_q * 9 * 64, 3);
        let k = values(kv * 3 * 64, 4);
        let v = values(kv * 3 * 64, 5);
        let mut out = vec![0.0f32; n_q * 9 * 64];
        g.bench_function(name, |b| {
            pool.install(|| b.iter(|| attention(&q, n_q, past, &k, &v, &shape, &mut out, &pool)))
        });
    }
    g.finish();
}

/// One decode step of 16 sequences after 256 tokens each, with the KV
/// cache stored as each type.
fn bench_kv_types(c: &mut Criterion) {
    let pool = pool(2);
    let mut g = c.benchmark_group("attention_decode16@256");
    let shape = SMOLLM2_ATTENTION;
    let (seqs, past, row) = (16, 256, 3 * 64);
    let q = values(seqs * 9 * 64, 3);
    let k = values(seqs * (past + 1) * row, 4);
    let v = values(seqs * (past + 1) * row, 5);
    for kind in KvDtype::ALL {
        let encoded = |x: &[f32]| {
            let mut b = vec![0u8; x.len() / row * kind.row_bytes(row)];
            encode(kind, x, &mut b);
            b
        };
        let (kb, vb) = (encoded(&k), encoded(&v));
        // Sequence `i`'s rows of `x` (f32) or of its encoding `b`.
        fn rows<'a>(kind: KvDtype, x: &'a [f32], b: &'a [u8], i: usize, n: usize) -> KvRows<'a> {
            let row = 3 * 64;
            match kind {
                KvDtype::F32 => KvRows::f32(x.chunks(x.len() / n).nth(i).unwrap(), row),
                _ => KvRows::encoded(kind, b.chunks(b.len() / n).nth(i).unwrap(), row),
            }
        }
        let batch: Vec<SeqAttention<'_>> = (0..seqs)
            .map(|i| SeqAttention {
                q: &q[i * 9 * 64..(i + 1) * 9 * 64],
                n_q: 1,
                past,
                k: rows(kind, &k, &kb, i, seqs),
                v: rows(kind, &v, &vb, i, seqs),
            })
            .collect();
        let mut out = vec![0.0f32; seqs * 9 * 64];
        g.bench_function(kind.to_string(), |b| {
            pool.install(|| {
                b.iter(|| {
                    let outs = out.chunks_mut(9 * 64).collect();
                    attention_batch(&batch, &shape, outs, &pool, SimdLevel::FASTEST_FIRST[0])
                })
            })
        });
    }
    g.finish();
}

/// One decode token after 128 (a short context, where the default model's
/// `tg128` spends its attention time) and after 4096 (a long one, where
/// attention dominates decode); see [`bench_decode_at`].
fn bench_decode_depths(c: &mut Criterion) {
    bench_decode_at(c, 128);
    bench_decode_at(c, 4096);
}

/// One decode token after `past`, with the cache stored as f32 and as f16
/// (llama.cpp's cache type), on one thread and on two. "in cache": the
/// same cache every call (3 or 6 MB after 4096, in L3 on most CPUs);
/// "from memory": the next of caches that together exceed 96 MiB, as in a
/// model whose weights push each layer's cache out of the caches between
/// its decode steps.
fn bench_decode_at(c: &mut Criterion, past: usize) {
    let mut g = c.benchmark_group(format!("attention_decode@{past}"));
    let shape = SMOLLM2_ATTENTION;
    let row = 3 * 64;
    let q = values(9 * 64, 3);
    let k = values((past + 1) * row, 4);
    let v = values((past + 1) * row, 5);
    for kind in [KvDtype::F32, KvDtype::F16] {
        let bytes = (past + 1) * kind.row_bytes(row);
        let copies = (96usize << 20).div_ceil(2 * bytes);
        // The copies of the rows in the kind's storage: f32 values, or
        // encoded bytes (the other vector stays empty).
        let f32_copies = |x: &[f32]| match kind {
            KvDtype::F32 => vec![x.to_vec(); copies],
            _ => Vec::new(),
        };
        let encoded = |x: &[f32]| match kind {
            KvDtype::F32 => Vec::new(),
            _ => {
                let mut b = vec![0u8; bytes];
                encode(kind, x, &mut b);
                vec![b; copies]
            }
        };
        let (kb, vb) = (encoded(&k), encoded(&v));
        let (kf, vf) = (f32_copies(&k), f32_copies(&v));
        let seqs: Vec<[SeqAttention<'_>; 1]> = (0..copies)
            .map(|i| {
                let (k, v) = match kind {
                    KvDtype::F32 => (KvRows::f32(&kf[i], row), KvRows::f32(&vf[i], row)),
                    _ => (
                        KvRows::encoded(kind, &kb[i], row),
                        KvRows::encoded(kind, &vb[i], row),
                    ),
                };
                [SeqAttention {
                    q: &q,
                    n_q: 1,
                    past,
                    k,
                    v,
                }]
            })
            .collect();
        let mut out = vec![0.0f32; 9 * 64];
        for threads in [1, 2] {
            let pool = pool(threads);
            for (case, rotate) in [("in cache", 1), ("from memory", copies)] {
                let name = BenchmarkId::new(kind.to_string(), format!("{threads} threads, {case}"));
                let mut next = 0;
                g.bench_function(name, |b| {
                    pool.install(|| {
                        b.iter(|| {
                            next = (next + 1) % rotate;
                            attention_batch(
                                &seqs[next],
                                &shape,
                                vec![&mut out],
                                &pool,
                                SimdLevel::FASTEST_FIRST[0],
                            )
                        })
                    })
                });
            }
        }
    }
    g.finish();
}

/// Decode through a packed Q4_1 matrix far larger than the caches (42 MB,
/// a 1B model's FFN projection four times over) on one thread, at each
/// level this CPU has: the memory stream the weight prefetch serves.
fn bench_streaming_decode(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let pool = pool(1);
    let mut g = c.benchmark_group("streaming_decode");
    let (out_f, in_f) = (32768, 2048);
    let (w, x) = linear_case(DType::Q4_1, out_f, in_f, 1);
    let m = QuantMatrix::new(QuantType::Q4_1, &w, out_f, in_f).expect("matrix");
    let p = PackedQ4::pack(&m).expect("packed");
    let mut y = vec![0.0f32; out_f];
    g.throughput(Throughput::Bytes(p.bytes().len() as u64));
    for level in X86_LEVELS {
        let Some(k) = QuantKernel::with_level(QuantPath::Int16Activations, level) else {
            continue;
        };
        g.bench_function(
            BenchmarkId::new("q4_1 32768x2048", format!("{level:?}")),
            |b| {
                pool.install(|| {
                    b.iter(|| packed_linear(k, &x, 1, &p, None, &mut y, &pool, &scratch))
                })
            },
        );
    }
    g.finish();
}

/// One-row products of the packed Q4_1, Q5_0, Q4_K, Q6_K and Q8_0
/// kernels at each level this CPU has, in bytes of weights per second, to
/// set against `examples/membw`: with the weights in L2 on one thread
/// (what a core computes when reads cost nothing; 192 x 2048, and for the
/// formats of 32-value blocks SmolLM2's 576 x 576 attention output, whose
/// short rows show a call's fixed costs), and on two threads
/// through a round of 1B-model FFN matrices (8192 x 2048) that together
/// exceed 768 MiB, so that every call reads its matrix from memory, as
/// decode does.
fn bench_decode_roofline(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let mut g = c.benchmark_group("decode_roofline");
    g.sample_size(20);
    let cases = [
        ("in L2, 1 thread", 1, 192, 2048),
        ("in L2, 1 thread", 1, 576, 576),
        ("from memory, 2 threads", 2, 8192, 2048),
    ];
    for dtype in [
        DType::Q4_1,
        DType::Q5_0,
        DType::Q4K,
        DType::Q6K,
        DType::Q8_0,
    ] {
        let qt = QuantType::from_dtype(dtype).expect("quantized dtype");
        for (case, threads, out_f, in_f) in cases {
            if in_f % qt.block_len() != 0 {
                continue;
            }
            let (w, x) = linear_case(dtype, out_f, in_f, 1);
            let m = QuantMatrix::new(qt, &w, out_f, in_f).expect("matrix");
            let copies = if threads == 1 {
                1
            } else {
                (768usize << 20).div_ceil(w.len())
            };
            let pool = pool(threads);
            g.throughput(Throughput::Bytes(w.len() as u64));
            let name = format!("{dtype} {out_f}x{in_f} {case}");
            // `copies` packed copies of `m` in `$packed`'s layout, timed
            // through `$linear` at each level.
            macro_rules! case {
                ($packed:ty, $linear:path) => {{
                    let packed: Vec<$packed> = (0..copies)
                        .map(|_| <$packed>::pack(&m).expect("packed"))
                        .collect();
                    each_level(&mut g, &name, &pool, &packed, out_f, |k, p, y| {
                        $linear(k, &x, 1, p, None, y, &pool, &scratch)
                    })
                }};
            }
            match dtype {
                DType::Q8_0 => case!(PackedQ8, packed_q8_linear),
                DType::Q6K => case!(PackedQ6K, packed_q6k_linear),
                DType::Q4K => case!(PackedQ4K, packed_q4k_linear),
                DType::Q5_0 => case!(PackedQ5, packed_q5_linear),
                DType::Q4_1 => case!(PackedQ4, packed_linear),
                other => unreachable!("no packed layout listed for {other}"),
            }
        }
    }
    g.finish();
}

/// Batched decode steps as a server runs them: 4 and 16 activation rows
/// through SmolLM2's FFN gate projection (1536 x 576) in the default
/// file's Q4_1 and its head's Q8_0, on two threads, through a round of
/// copies that together exceed 768 MiB, so that every call reads its
/// matrix from memory. In multiply-adds per second.
fn bench_batched_decode(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let mut g = c.benchmark_group("batched_decode");
    g.sample_size(20);
    let (out_f, in_f) = (1536, 576);
    let pool = pool(2);
    for dtype in [DType::Q4_1, DType::Q8_0] {
        let qt = QuantType::from_dtype(dtype).expect("quantized dtype");
        let w = quantize(dtype, &values(out_f * in_f, 1)).expect("quantize");
        let m = QuantMatrix::new(qt, &w, out_f, in_f).expect("matrix");
        let copies = (768usize << 20).div_ceil(w.len());
        for rows in [4, 16] {
            let x = values(rows * in_f, 2);
            g.throughput(Throughput::Elements((rows * out_f * in_f) as u64));
            let name = format!("{dtype} {out_f}x{in_f} from memory, {rows} rows");
            // `copies` packed copies of `m` in `$packed`'s layout, timed
            // through `$linear` at each level.
            macro_rules! case {
                ($packed:ty, $linear:path) => {{
                    let packed: Vec<$packed> = (0..copies)
                        .map(|_| <$packed>::pack(&m).expect("packed"))
                        .collect();
                    each_level(&mut g, &name, &pool, &packed, rows * out_f, |k, p, y| {
                        $linear(k, &x, rows, p, None, y, &pool, &scratch)
                    })
                }};
            }
            match dtype {
                DType::Q8_0 => case!(PackedQ8, packed_q8_linear),
                _ => case!(PackedQ4, packed_linear),
            }
        }
    }
    g.finish();
}

/// Prefill through packed weights (SmolLM2's FFN up projection, 128
/// rows): the integer GEMMs of Q8_0, Q4_1 and Q5_0 weights with 16-bit
/// activation rows and the float GEMM of f16 weights, at each level this
/// CPU has, on one thread (the kernel alone) and two; and the f16 GEMM
/// over a 1.1B model's wider rows.
fn bench_packed_prefill(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let mut g = c.benchmark_group("packed_prefill");
    let (out_f, in_f, rows) = (1536, 576, 128);
    let (w, x) = linear_case(DType::Q8_0, out_f, in_f, rows);
    let m = QuantMatrix::new(QuantType::Q8_0, &w, out_f, in_f).expect("matrix");
    let q8 = PackedQ8::pack(&m).expect("packed");
    let w4 = quantize(DType::Q4_1, &values(out_f * in_f, 1)).expect("quantize");
    let m4 = QuantMatrix::new(QuantType::Q4_1, &w4, out_f, in_f).expect("matrix");
    let q4 = PackedQ4::pack(&m4).expect("packed");
    let w5 = quantize(DType::Q5_0, &values(out_f * in_f, 1)).expect("quantize");
    let m5 = QuantMatrix::new(QuantType::Q5_0, &w5, out_f, in_f).expect("matrix");
    let q5 = PackedQ5::pack(&m5).expect("packed");
    let bits: Vec<u16> = values(out_f * in_f, 3)
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let f16 = PackedHalf::pack(&bits, HalfBits::F16, out_f, in_f).expect("packed");
    // A down projection in Q6_K (rows of 1536 columns: whole 256-blocks).
    let w6 = quantize(DType::Q6K, &values(in_f * out_f, 6)).expect("quantize");
    let m6 = QuantMatrix::new(QuantType::Q6K, &w6, in_f, out_f).expect("matrix");
    let q6 = PackedQ6K::pack(&m6).expect("packed");
    let x_down = values(rows * out_f, 7);
    let mut y_down = vec![0.0f32; rows * in_f];
    // A 1.1B model's attention output projection: rows of 2048 columns,
    // 64 KiB of f16 weights per pair of row groups.
    let wide = 2048;
    let bits: Vec<u16> = values(wide * wide, 4)
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let f16_wide = PackedHalf::pack(&bits, HalfBits::F16, wide, wide).expect("packed");
    let x_wide = values(rows * wide, 5);
    let mut y_wide = vec![0.0f32; rows * wide];
    let mut y = vec![0.0f32; rows * out_f];
    g.throughput(Throughput::Elements((rows * out_f * in_f) as u64));
    for threads in [1, 2] {
        let pool = pool(threads);
        let paths = [QuantPath::Int16Activations, QuantPath::Int8Packed];
        for (path, level) in paths.into_iter().flat_map(|p| X86_LEVELS.map(|l| (p, l))) {
            let Some(k) = QuantKernel::with_level(path, level) else {
                continue;
            };
            let rows_of = if path == QuantPath::Int8Packed {
                "8-bit"
            } else {
                "16-bit"
            };
            let case = |name: &str| {
                let name = format!("{name}, {rows_of} rows, {threads} threads");
                BenchmarkId::new(name, format!("{level:?}"))
            };
            g.bench_function(case("q8_0 ffn prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| packed_q8_linear(k, &x, rows, &q8, None, &mut y, &pool, &scratch))
                })
            });
            g.bench_function(case("q4_1 ffn prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| packed_linear(k, &x, rows, &q4, None, &mut y, &pool, &scratch))
                })
            });
            g.bench_function(case("q5_0 ffn prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| packed_q5_linear(k, &x, rows, &q5, None, &mut y, &pool, &scratch))
                })
            });
            g.bench_function(case("q6_k ffn down prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        packed_q6k_linear(k, &x_down, rows, &q6, None, &mut y_down, &pool, &scratch)
                    })
                })
            });
            if path == QuantPath::Int8Packed {
                // The float layout takes no activation rows in bytes.
                continue;
            }
            g.bench_function(case("f16 ffn prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| packed_half_linear(k, &x, rows, &f16, None, &mut y, &pool))
                })
            });
            g.throughput(Throughput::Elements((rows * wide * wide) as u64));
            g.bench_function(case("f16 2048x2048 prefill128"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        packed_half_linear(k, &x_wide, rows, &f16_wide, None, &mut y_wide, &pool)
                    })
                })
            });
            g.throughput(Throughput::Elements((rows * out_f * in_f) as u64));
        }
    }
    g.finish();
}

/// The 1.1B Llama-shaped model's FFN in Q4_K, the bulk of a Q4_K_M file's
/// prefill: the gate projection (rows of 2048 columns) and the down
/// projection (rows of 8192, where a tile's activation rows outgrow L1),
/// 128 rows, two threads, each activation width at each level.
fn bench_q4k_prefill(c: &mut Criterion) {
    let scratch = ActivationScratch::default();
    let mut g = c.benchmark_group("q4k_prefill_1b");
    let (hidden, ffn, rows) = (2048, 8192, 128);
    let pack = |out_f: usize, in_f: usize, seed: u64| {
        let w = quantize(DType::Q4K, &values(out_f * in_f, seed)).expect("quantize");
        let m = QuantMatrix::new(QuantType::Q4K, &w, out_f, in_f).expect("matrix");
        PackedQ4K::pack(&m).expect("packed")
    };
    let cases = [
        (
            "gate 8192x2048",
            pack(ffn, hidden, 1),
            values(rows * hidden, 2),
            ffn,
        ),
        (
            "down 2048x8192",
            pack(hidden, ffn, 3),
            values(rows * ffn, 4),
            hidden,
        ),
    ];
    g.throughput(Throughput::Elements((rows * hidden * ffn) as u64));
    let pool = pool(2);
    for path in [QuantPath::Int16Activations, QuantPath::Int8Packed] {
        for level in X86_LEVELS {
            let Some(k) = QuantKernel::with_level(path, level) else {
                continue;
            };
            for (name, w, x, out_f) in &cases {
                let mut y = vec![0.0f32; rows * out_f];
                let id = BenchmarkId::new(format!("{name}, {path:?}"), format!("{level:?}"));
                g.bench_function(id, |b| {
                    pool.install(|| {
                        b.iter(|| packed_q4k_linear(k, x, rows, w, None, &mut y, &pool, &scratch))
                    })
                });
            }
        }
    }
    g.finish();
}

/// Benchmarks `product` at each level this CPU has, one call per
/// iteration on the next of the `packed` copies in turn, into `outputs`
/// values.
fn each_level<P: Sync>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    pool: &rayon::ThreadPool,
    packed: &[P],
    outputs: usize,
    product: impl Fn(QuantKernel, &P, &mut [f32]) + Sync,
) {
    let mut y = vec![0.0f32; outputs];
    for level in X86_LEVELS {
        let Some(k) = QuantKernel::with_level(QuantPath::Int16Activations, level) else {
            continue;
        };
        let mut next = 0;
        g.bench_function(BenchmarkId::new(name, format!("{level:?}")), |b| {
            pool.install(|| {
                b.iter(|| {
                    next = (next + 1) % packed.len();
                    product(k, &packed[next], &mut y)
                })
            })
        });
    }
}

criterion_group!(
    benches,
    bench_linear,
    bench_attention,
    bench_kv_types,
    bench_decode_depths,
    bench_streaming_decode,
    bench_decode_roofline,
    bench_batched_decode,
    bench_packed_prefill,
    bench_q4k_prefill
);
criterion_main!(benches);
