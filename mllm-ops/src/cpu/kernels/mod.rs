//! Pure CPU compute kernels over `f32` slices.
//!
//! Every kernel works on plain slices (no framework types). Activations are
//! `f32`, row-major, one row per token. Kernels whose work can be large take a
//! `&rayon::ThreadPool` and run in it; they fall back to a serial loop when the
//! work is tiny. Slice-length preconditions are checked with `debug_assert!`.

pub mod activation;
pub mod attention;
pub mod columns;
pub mod elementwise;
pub mod embedding;
pub mod kv_rows;
pub mod matmul;
pub mod norm;
pub mod packed;
pub mod packed_half;
pub mod packed_q4k;
pub mod packed_q5;
pub mod packed_q5k;
pub mod packed_q6k;
pub mod packed_q8;
pub mod peak;
pub(crate) mod qact;
pub(crate) mod qdot;
pub mod qembedding;
pub mod qkernel;
pub mod qmatmul;
pub mod rope;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd;
pub mod softmax;
pub(crate) mod task_queue;
pub mod weight_memory;

pub use activation::{geglu, geglu_tanh, gelu, gelu_tanh, reglu, relu, silu, swiglu};
pub use attention::{attention, attention_batch, AttnShape, SeqAttention};
pub use columns::slice_columns;
pub use elementwise::{add, add_assign, mul, mul_assign, scale};
pub use embedding::embedding;
pub use kv_rows::KvRows;
pub use matmul::{axpy, dot, linear, WeightElem};
pub use norm::{layer_norm, rms_norm};
pub use packed::{packed_linear, PackedQ4};
pub use packed_half::{packed_half_linear, PackedHalf};
pub use packed_q4k::{packed_q4k_linear, PackedQ4K};
pub use packed_q5::{packed_q5_linear, PackedQ5};
pub use packed_q6k::{packed_q6k_linear, PackedQ6K};
pub use packed_q8::{packed_q8_linear, PackedQ8};
pub use qact::ActivationScratch;
pub use qembedding::quant_embedding;
pub use qkernel::{QuantKernel, QuantPath, SimdLevel};
pub use qmatmul::{quant_linear, QuantMatrix};
pub use rope::{apply_rope, rope_inv_freq, Llama3Scaling};
pub use softmax::softmax_rows;
pub use weight_memory::{WeightArena, WeightMemory};

/// Work (in multiply-adds or comparable scalar operations) below which a
/// kernel runs serially instead of dispatching to the thread pool.
pub(crate) const PAR_THRESHOLD: usize = 32 * 1024;

/// Bytes of a cache line on the CPUs the kernels are tuned for (the line
/// that `mllm_core::LineBuffer`s start on).
pub(crate) const CACHE_LINE: usize = mllm_core::line_buffer::LINE;

/// Helpers shared by the kernel tests.
#[cfg(test)]
pub(crate) mod test_util {

    /// f64 reference of `y = x W^T + b` (W `[out_f, in_f]`) and the
    /// magnitude `Σ |x·w| + |b|` of each output, for relative tolerances.
    pub fn linear_reference(
        x: &[f32],
        rows: usize,
        in_f: usize,
        w: &[f32],
        out_f: usize,
        bias: Option<&[f32]>,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut y = vec![0.0f64; rows * out_f];
        let mut mag = vec![0.0f64; rows * out_f];
        for t in 0..rows {
            for o in 0..out_f {
                let mut s = bias.map_or(0.0, |b| b[o] as f64);
                let mut m = s.abs();
                for i in 0..in_f {
                    let p = x[t * in_f + i] as f64 * w[o * in_f + i] as f64;
                    s += p;
                    m += p.abs();
                }
                y[t * out_f + o] = s;
                mag[t * out_f + o] = m;
            }
        }
        (y, mag)
    }

    /// Asserts `|y[i] − want[i]| ≤ tol · mag[i]` for every output (`mag`
    /// from [`linear_reference`]), naming `what` and the index.
    pub fn assert_within(y: &[f32], want: &[f64], mag: &[f64], tol: f64, what: &str) {
        for (i, ((&got, &w), &m)) in y.iter().zip(want).zip(mag).enumerate() {
            assert!(
                (got as f64 - w).abs() <= tol * m,
                "{what} idx={i}: {got} vs {w}"
            );
        }
    }

    /// A tiny deterministic PRNG (xorshift64*).
    pub struct Rng(u64);

    impl Rng {
        /// Creates a generator from a seed (any value, zero included).
        pub fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        /// Next raw 64-bit value.
        pub fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// Uniform in `[-1, 1)`.
        pub fn uniform(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }

        /// `n` values uniform in `[-scale, scale)`.
        pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.uniform() * scale).collect()
        }

        /// Uniform integer in `0..n`.
        pub fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Asserts `|got - want| <= atol + rtol * |want|` element-wise.
    #[track_caller]
    pub fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64) {
        assert_eq!(got.len(), want.len(), "length mismatch");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - w).abs();
            assert!(
                err <= atol + rtol * w.abs(),
                "index {i}: got {g}, want {w}, |err| = {err:e}"
            );
        }
    }

    /// The bit patterns of `v`, to compare floats exactly (NaN included).
    pub fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A two-thread pool.
    pub fn pool2() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("building a thread pool")
    }

    /// A one-thread pool.
    pub fn pool1() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("building a thread pool")
    }
}
