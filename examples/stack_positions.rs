//! Times one packed prefill kernel from many positions of the worker's
//! stack, to find the positions where it runs slower than elsewhere.
//!
//! ```text
//! cargo run --release --example stack_positions -- --kernel q4_1 --rows 16 --passes 3
//! cargo run --release --example stack_positions -- --kernel q8_0 --shape 1b --threads 2
//! ```
//!
//! A kernel short of registers spills to its stack frame and may reload
//! vector constants from the binary's read-only data inside its loop; when
//! a spill slot has the same low 12 address bits as such a constant (4 KiB
//! aliasing), each reload waits on the spill's store, and the kernel runs
//! up to twice as slow for some positions of the caller's stack and not
//! for others (BENCHMARKS.md, "kernel speed that depended on where the
//! worker's stack sits"). This runs one 1536 x 576 layer over 128 rows (the
//! benches' `packed_prefill` case; `--shape 1b` takes the 1B model's
//! 8192 x 2048 one) on one thread (or `--threads`), called from frames that
//! shift the stack by steps of 16 bytes over 4 KiB, every position a few
//! calls a round so that the host's slow phases hit them all alike, and
//! keeps each position's best time. It does that `--passes` times and
//! names the positions that are slow in every pass: a slow phase of the
//! host moves between passes, an aliasing window does not.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use mllm::cli;
use mllm::core::{DType, Error, Result};
use mllm::machine;
use mllm::ops::cpu::kernels::matmul::HalfBits;
use mllm::ops::cpu::kernels::{
    packed_half_linear, packed_linear, packed_q4k_linear, packed_q5_linear, packed_q6k_linear,
    packed_q8_linear, ActivationScratch, PackedHalf, PackedQ4, PackedQ4K, PackedQ5, PackedQ6K,
    PackedQ8, QuantKernel, QuantMatrix, QuantPath, SimdLevel,
};
use mllm::ops::quant::{quantize, QuantType};

/// Stack positions swept: 16-byte steps over 4 KiB.
const POSITIONS: usize = 256;
/// Bytes each extra frame of [`descend`] adds to the stack, at least (the
/// compiler rounds a frame up; what matters is that the steps cover 4 KiB).
const FRAME_PAD: usize = 64;
/// Activation rows: a 128-token prefill.
const ROWS: usize = 128;

/// The layer: an FFN up projection; the K-quants take its down projection.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Shape {
    /// SmolLM2's, 576 -> 1536.
    #[value(name = "smollm2")]
    SmolLm2,
    /// The 1.1B benchmark model's, 2048 -> 8192.
    #[value(name = "1b")]
    OneB,
}

impl Shape {
    /// `(out_f, in_f)` of the up projection.
    fn dims(self) -> (usize, usize) {
        match self {
            Shape::SmolLm2 => (1536, 576),
            Shape::OneB => (8192, 2048),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Kernel {
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "f16")]
    F16,
}

#[derive(Parser, Debug)]
#[command(about = "Time a packed kernel from many stack positions")]
struct Args {
    /// The packed weight type whose prefill kernel runs.
    #[arg(long, value_enum, default_value_t = Kernel::Q4_1)]
    kernel: Kernel,
    /// Width of the activation rows: 16 or 8 bits (f16 takes 16 only).
    #[arg(long, default_value_t = 16)]
    rows: u32,
    /// Kernel level: amx, avx512, avxvnni, avx2, neon or scalar (default: the
    /// fastest this CPU has).
    #[arg(long, value_name = "LEVEL")]
    level: Option<SimdLevel>,
    /// Rounds over all positions per pass.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Calls per position and round (each position keeps its best).
    #[arg(long, default_value_t = 3)]
    calls: usize,
    /// Passes; a position is named slow only if it is slow in all of them.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// A position is slow under this share of the pass's median speed.
    #[arg(long, default_value_t = 0.8)]
    slow_share: f64,
    /// The layer's shape.
    #[arg(long, value_enum, default_value_t = Shape::SmolLm2)]
    shape: Shape,
    /// Worker threads the layer splits over.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// One layer's weights of every kernel and its input and output rows.
struct Case {
    /// Outputs and inputs of the up projection (the K-quants' down
    /// projection the other way round).
    out_f: usize,
    in_f: usize,
    q4: PackedQ4,
    q5: PackedQ5,
    q4k: PackedQ4K,
    q6: PackedQ6K,
    q8: PackedQ8,
    f16: PackedHalf,
    x: Vec<f32>,
    x_down: Vec<f32>,
    y: Vec<f32>,
}

/// Seeded values in [-1, 1): the top bits of a multiplicative hash of
/// each index (only their spread matters for timing).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h = (i ^ seed << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            h as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `[out_f, in_f]` seeded weights quantized to `dtype`.
fn quantized(dtype: DType, out_f: usize, in_f: usize) -> Result<Vec<u8>> {
    quantize(dtype, &values(out_f * in_f, 1))
}

impl Case {
    fn new(shape: Shape) -> Result<Case> {
        let (out_f, in_f) = shape.dims();
        let w4 = quantized(DType::Q4_1, out_f, in_f)?;
        let w5 = quantized(DType::Q5_0, out_f, in_f)?;
        let w8 = quantized(DType::Q8_0, out_f, in_f)?;
        // The K-quants take the down projection: its rows (1536 or 8192
        // wide) are whole 256-blocks.
        let w4k = quantized(DType::Q4K, in_f, out_f)?;
        let w6 = quantized(DType::Q6K, in_f, out_f)?;
        let bits: Vec<u16> = values(out_f * in_f, 3)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        Ok(Case {
            out_f,
            in_f,
            q4: PackedQ4::pack(&QuantMatrix::new(QuantType::Q4_1, &w4, out_f, in_f)?)?,
            q5: PackedQ5::pack(&QuantMatrix::new(QuantType::Q5_0, &w5, out_f, in_f)?)?,
            q4k: PackedQ4K::pack(&QuantMatrix::new(QuantType::Q4K, &w4k, in_f, out_f)?)?,
            q6: PackedQ6K::pack(&QuantMatrix::new(QuantType::Q6K, &w6, in_f, out_f)?)?,
            q8: PackedQ8::pack(&QuantMatrix::new(QuantType::Q8_0, &w8, out_f, in_f)?)?,
            f16: PackedHalf::pack(&bits, HalfBits::F16, out_f, in_f)?,
            x: values(ROWS * in_f, 2),
            x_down: values(ROWS * out_f, 7),
            y: vec![0.0; ROWS * out_f],
        })
    }

    /// Multiply-adds of one call.
    fn macs(&self) -> f64 {
        (ROWS * self.out_f * self.in_f) as f64
    }

    /// One call of `kernel` over the case's rows.
    fn run(
        &mut self,
        kernel: Kernel,
        k: QuantKernel,
        pool: &rayon::ThreadPool,
        s: &ActivationScratch,
    ) {
        let y = &mut self.y;
        match kernel {
            Kernel::Q4_1 => packed_linear(k, &self.x, ROWS, &self.q4, None, y, pool, s),
            Kernel::Q5_0 => packed_q5_linear(k, &self.x, ROWS, &self.q5, None, y, pool, s),
            Kernel::Q8_0 => packed_q8_linear(k, &self.x, ROWS, &self.q8, None, y, pool, s),
            Kernel::Q4K => {
                let y = &mut y[..ROWS * self.in_f];
                packed_q4k_linear(k, &self.x_down, ROWS, &self.q4k, None, y, pool, s)
            }
            Kernel::Q6K => {
                let y = &mut y[..ROWS * self.in_f];
                packed_q6k_linear(k, &self.x_down, ROWS, &self.q6, None, y, pool, s)
            }
            Kernel::F16 => packed_half_linear(k, &self.x, ROWS, &self.f16, None, y, pool),
        }
    }
}

/// Runs `f` from `depth` frames of at least [`FRAME_PAD`] bytes below here.
#[inline(never)]
fn descend(depth: usize, f: &mut dyn FnMut()) {
    let pad = [depth as u8; FRAME_PAD];
    black_box(&pad);
    if depth == 0 {
        f()
    } else {
        descend(depth - 1, f)
    }
    black_box(&pad);
}

/// Runs `f` from a frame of `N` bytes, then [`descend`]s `depth` frames.
#[inline(never)]
fn offset<const N: usize>(depth: usize, f: &mut dyn FnMut()) {
    let pad = [1u8; N];
    black_box(&pad);
    descend(depth, f);
    black_box(&pad);
}

/// Runs `f` from stack position `pos`: 16-byte offsets within each frame
/// step of [`descend`].
fn at_position(pos: usize, f: &mut dyn FnMut()) {
    let depth = pos / 4;
    match pos % 4 {
        0 => offset::<0>(depth, f),
        1 => offset::<16>(depth, f),
        2 => offset::<32>(depth, f),
        _ => offset::<48>(depth, f),
    }
}

/// The median of `v`.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn main() -> ExitCode {
    cli::exit_code(run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    if args.rounds == 0 || args.calls == 0 || args.passes == 0 || args.threads == 0 {
        return Err(Error::InvalidInput(
            "--rounds, --calls, --passes and --threads must be at least 1".into(),
        ));
    }
    let path = match (args.rows, args.kernel) {
        (16, _) => QuantPath::Int16Activations,
        (8, Kernel::F16) => {
            return Err(Error::InvalidInput(
                "the f16 kernel takes 16-bit rows only".into(),
            ))
        }
        (8, _) => QuantPath::Int8Packed,
        (bits, _) => {
            return Err(Error::InvalidInput(format!(
                "--rows must be 16 or 8, not {bits}"
            )))
        }
    };
    let kernel = match args.level {
        None => QuantKernel::new(path),
        Some(level) => QuantKernel::with_level(path, level).ok_or_else(|| {
            Error::InvalidInput(format!("this CPU does not run the {level} level"))
        })?,
    };
    let mut case = Case::new(args.shape)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .map_err(|e| Error::InvalidInput(format!("cannot start {} threads: {e}", args.threads)))?;
    let scratch = ActivationScratch::default();
    let macs = case.macs();
    println!("{}", machine::describe(path, kernel.level().into()));
    println!(
        "kernel {:?}, {}-bit rows, level {:?}, {:?} layer, {} threads: best GMAC/s per stack position",
        args.kernel,
        args.rows,
        kernel.level(),
        args.shape,
        args.threads
    );
    let mut slow_passes = vec![0usize; POSITIONS];
    pool.install(|| {
        for _ in 0..3 {
            case.run(args.kernel, kernel, &pool, &scratch);
        }
        for pass in 0..args.passes {
            let mut best = vec![f64::MAX; POSITIONS];
            for _ in 0..args.rounds {
                for (pos, best) in best.iter_mut().enumerate() {
                    at_position(pos, &mut || {
                        for _ in 0..args.calls {
                            let start = Instant::now();
                            case.run(args.kernel, kernel, &pool, &scratch);
                            *best = best.min(start.elapsed().as_secs_f64());
                        }
                    });
                }
            }
            let rates: Vec<f64> = best.iter().map(|s| macs / s / 1e9).collect();
            let mid = median(&rates);
            let (lo, hi) = rates
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            let slow: Vec<usize> = (0..POSITIONS)
                .filter(|&p| rates[p] < args.slow_share * mid)
                .collect();
            for &p in &slow {
                slow_passes[p] += 1;
            }
            println!(
                "pass {}: min {lo:.1}, median {mid:.1}, max {hi:.1}; {} positions under {:.0} % of the median",
                pass + 1,
                slow.len(),
                100.0 * args.slow_share
            );
        }
    });
    let passes = args.passes;
    let slow_in = |least: usize| -> Vec<String> {
        (0..POSITIONS)
            .filter(|&p| slow_passes[p] >= least)
            .map(|p| format!("{p} ({}/{passes})", slow_passes[p]))
            .collect()
    };
    let always = slow_in(passes);
    if always.is_empty() {
        println!("no position is slow in every pass");
    } else {
        println!("slow in every pass: positions {}", always.join(" "));
    }
    if passes > 2 {
        let most = slow_in(passes / 2 + 1);
        println!("slow in most passes: {}", most.join(" "));
    }
    Ok(())
}
