//! The arithmetic peak of this CPU: the roofline for prefill, as `membw`
//! is for decode.
//!
//! ```text
//! cargo run --release --example peak -- -t 2 -r 5
//! ```
//!
//! `-t` threads each run the same number of multiply-add loops with no
//! memory traffic (see `mllm::ops::cpu::kernels::peak`), for f32 fused
//! multiply-adds and for byte products summed into 32-bit lanes (what the
//! integer kernels run), at the fastest level this CPU has or at every
//! level with `--all-levels`; the best of `-r` passes is reported as
//! billions of multiply-adds per second (GMAC/s; one multiply-add is two
//! FLOP).

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use mllm::core::{Error, Result};
use mllm::machine;
use mllm::ops::cpu::kernels::peak::{self, PeakKind, MAX_ITERS};
use mllm::ops::cpu::kernels::SimdLevel;

#[derive(Parser, Debug)]
#[command(about = "Measure the multiply-add peak of the CPU")]
struct Args {
    /// Threads running at once.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Passes (the best one is reported).
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// Loops of each thread per pass (each loop is the largest run).
    #[arg(long, default_value_t = 40)]
    loops: usize,
    /// Measure every level this CPU runs, not only the fastest.
    #[arg(long)]
    all_levels: bool,
}

/// Multiply-adds per second of `kind` at `level` on `threads` threads,
/// best of `reps` passes; `None` when the CPU lacks the level.
fn measure(kind: PeakKind, level: SimdLevel, args: &Args) -> Result<Option<f64>> {
    peak::run(kind, level, 1).map_or(Ok(None), |_| {
        let mut best = 0.0f64;
        for _ in 0..args.reps {
            let started = Instant::now();
            let done: Vec<peak::PeakRun> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..args.threads)
                    .map(|_| {
                        s.spawn(|| {
                            (0..args.loops)
                                .filter_map(|_| peak::run(kind, level, MAX_ITERS))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            });
            let secs = started.elapsed().as_secs_f64();
            let macs: u64 = done.iter().map(|r| r.multiply_adds).sum();
            if let Some(bad) = done.iter().find(|r| r.checksum != r.multiply_adds as f64) {
                return Err(Error::InvalidInput(format!(
                    "{kind:?} at {level:?} summed to {} instead of {}",
                    bad.checksum, bad.multiply_adds
                )));
            }
            best = best.max(macs as f64 / secs);
        }
        Ok(Some(best))
    })
}

fn run(args: Args) -> Result<()> {
    if args.threads == 0 || args.reps == 0 || args.loops == 0 {
        return Err(Error::InvalidInput(
            "-t, -r and --loops must be at least 1".into(),
        ));
    }
    println!(
        "{}",
        machine::describe(mllm::ops::cpu::kernels::QuantPath::Int16Activations, None)
    );
    for kind in [PeakKind::F32Fma, PeakKind::ByteDot] {
        for level in SimdLevel::FASTEST_FIRST {
            let Some(rate) = measure(kind, level, &args)? else {
                continue;
            };
            let what = match kind {
                PeakKind::F32Fma => "f32 fused multiply-add",
                PeakKind::ByteDot => "byte multiply-add (u8 x i8 -> i32)",
            };
            println!(
                "{what:<36} {level:<7} {:>8.1} GMAC/s ({} threads, best of {} passes)",
                rate / 1e9,
                args.threads,
                args.reps
            );
            if !args.all_levels {
                break;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
