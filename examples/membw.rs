//! A STREAM-like read-bandwidth test: the roofline for decode, which streams
//! every weight once per token.
//!
//! ```text
//! cargo run --release --example membw -- -t 2 --mib 512 -r 10
//! ```
//!
//! A buffer of `--mib` MiB (far larger than the caches) is filled once, then
//! `-t` threads each sum their contiguous share of it with wide independent
//! accumulators; the best of `-r` passes is reported as read GB/s
//! (1 GB = 1e9 bytes), like STREAM's "best rate".
//!
//! The buffer is the memory repacked weights live in
//! ([`WeightMemory`]: transparent huge pages where the kernel gives them),
//! so this is the ceiling those weights can be read at; `--small-pages`
//! measures an ordinary heap buffer of 4 KiB pages instead.

use std::time::Instant;

use clap::Parser;
use mllm::ops::cpu::kernels::WeightMemory;

#[derive(Parser, Debug)]
#[command(about = "Measure memory read bandwidth")]
struct Args {
    /// Threads reading at once.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Buffer size in MiB.
    #[arg(long, default_value_t = 512)]
    mib: usize,
    /// Passes (the best one is reported).
    #[arg(short = 'r', long, default_value_t = 10)]
    reps: usize,
    /// Read an ordinary heap buffer (4 KiB pages) instead of weight memory.
    #[arg(long)]
    small_pages: bool,
}

/// Sum of `x` with 16 independent lanes (the loop vectorizes).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for c in x.chunks_exact(16) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum()
}

fn main() {
    let args = Args::parse();
    let threads = args.threads.max(1);
    let n = args.mib * 1024 * 1024 / 4;
    let mut heap = Vec::new();
    let mut weights = None;
    let data: &mut [f32] = if args.small_pages {
        heap.resize(n, 0.0f32);
        &mut heap
    } else {
        let memory = weights.insert(WeightMemory::zeroed(n * 4).unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        }));
        bytemuck::cast_slice_mut(memory)
    };
    for (i, v) in data.iter_mut().enumerate() {
        *v = (i % 7) as f32;
    }
    let data = &*data;
    let share = n.div_ceil(threads).next_multiple_of(16);
    let mut best = f64::MAX;
    let mut check = 0.0f32;
    for _ in 0..args.reps {
        let t0 = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(share)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        check += total;
    }
    let gbs = (n * 4) as f64 / best / 1e9;
    println!(
        "read bandwidth: {gbs:.2} GB/s ({threads} threads, {} MiB buffer of {}, best of {} passes; checksum {check:e})",
        args.mib,
        if args.small_pages { "4 KiB pages" } else { "weight memory" },
        args.reps
    );
}
