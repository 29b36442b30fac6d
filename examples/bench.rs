//! Prompt-processing and token-generation speed, in the style of llama-bench.
//!
//! ```text
//! cargo run --release --example bench -- -p 16,128,512 -n 32,128 -t 2 -r 5
//! cargo run --release --example bench -- --model m.mllm -p 128 -n 0 --json
//! ```
//!
//! A `pp N` test times the prefill of N tokens as generation runs it (steps
//! of at most `PREFILL_STEP_TOKENS`, 512, llama-bench's default
//! micro-batch); a `tg N` test times N single-token decode steps. Both
//! start from an empty KV cache, filled first to `-d DEPTH` tokens when
//! given (untimed, in the same steps, so that the peak RSS is the cache's
//! and not a long step's activations). Each test
//! runs once to warm up, then `-r` times; the table shows mean ± standard
//! deviation of tokens/s. `--json` prints one JSON array with llama-bench's
//! field names. `--profile` adds the time per op kind over the timed steps
//! of all timed runs, `--profile-nodes` also every node's, in graph order
//! (which layer's which call takes how long). `-b B` decodes B sequences
//! together in the `tg` tests (one token each per step, in B KV slots, as
//! a server does), and counts B tokens per step. Both outputs name the CPU
//! and the kernel level that ran (`cpu_info` and `kernel_level` in the
//! JSON).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use mllm::convert::default_model;
use mllm::core::executor::{NodeProfile, OpProfile};
use mllm::core::file::MllmFile;
use mllm::core::{Error, LogitsMode, Result, SeqChunk, StepInput};
use mllm::machine;
use mllm::models::{prefill, LoadOptions, Model, PREFILL_STEP_TOKENS};
use mllm::ops::cpu::kernels::QuantPath;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Measure prefill and decode speed of a .mllm model")]
struct Args {
    /// The .mllm model file (default: the cached SmolLM2-135M-Instruct Q4_1).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Prompt lengths to test (pp), comma-separated; 0 skips.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (tg), comma-separated; 0 skips.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Tokens already in the KV cache before each test.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    depth: usize,
    #[command(flatten)]
    backend: mllm::cli::BackendArgs,
    #[command(flatten)]
    files: mllm::cli::ModelFileArgs,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    threads: usize,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Sequences decoded together in the tg tests (each in its own KV slot).
    #[arg(short = 'b', long = "batch", default_value_t = 1)]
    batch: usize,
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Also print the time spent per op kind.
    #[arg(long)]
    profile: bool,
    /// Also print the time spent in every node, in graph order (implies
    /// --profile).
    #[arg(long)]
    profile_nodes: bool,
}

/// One test: prefill of `n_prompt` tokens or `n_gen` decode steps of
/// `batch` sequences.
#[derive(Clone, Copy, Debug)]
struct Test {
    n_prompt: usize,
    n_gen: usize,
    batch: usize,
}

impl Test {
    fn name(&self, depth: usize) -> String {
        let base = if self.n_prompt > 0 {
            format!("pp{}", self.n_prompt)
        } else if self.batch > 1 {
            format!("tg{} x{}", self.n_gen, self.batch)
        } else {
            format!("tg{}", self.n_gen)
        };
        if depth > 0 {
            format!("{base} @ d{depth}")
        } else {
            base
        }
    }

    /// Tokens one repetition processes.
    fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen * self.batch
    }
}

/// Deterministic pseudo-random token ids below `vocab`.
fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

/// Runs one repetition and returns its duration (depth filling not timed);
/// with `profile`, adds the time of its timed steps per node there.
fn run_once(
    model: &mut Model,
    test: Test,
    depth: usize,
    seed: u64,
    profile: Option<&mut Vec<NodeProfile>>,
) -> Result<Duration> {
    let vocab = model.vocab_size();
    for slot in 0..test.batch {
        model.reset_slot(slot);
        let fill = token_ids(depth, vocab, seed ^ 0xD ^ slot as u64);
        if !fill.is_empty() {
            prefill(model, slot, &fill, LogitsMode::Last, PREFILL_STEP_TOKENS)?;
        }
    }
    model.executor_mut().set_profiling(profile.is_some());
    let started = Instant::now();
    if test.n_prompt > 0 {
        let ids = token_ids(test.n_prompt, vocab, seed);
        prefill(model, 0, &ids, LogitsMode::Last, PREFILL_STEP_TOKENS)?;
    } else {
        let ids = token_ids(test.n_gen * test.batch, vocab, seed);
        for step in ids.chunks_exact(test.batch) {
            let chunks = step
                .iter()
                .enumerate()
                .map(|(slot, &id)| SeqChunk {
                    slot,
                    tokens: vec![id],
                })
                .collect();
            model.step(&StepInput {
                chunks,
                logits: LogitsMode::Last,
            })?;
        }
    }
    let elapsed = started.elapsed();
    if let Some(sum) = profile {
        add_profile(sum, model.executor().node_profile());
    }
    Ok(elapsed)
}

/// Adds the per-node times of `more` (one run's, in graph order) to `sum`.
fn add_profile(sum: &mut Vec<NodeProfile>, more: Vec<NodeProfile>) {
    if sum.is_empty() {
        *sum = more;
        return;
    }
    for (s, p) in sum.iter_mut().zip(more) {
        s.total += p.total;
    }
}

/// Prints the time per op kind of `nodes` (summed over `reps` runs), per
/// run, and with `each_node` every node's too.
fn print_profile(name: &str, reps: usize, nodes: &[NodeProfile], each_node: bool) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / reps as f64;
    let kinds = OpProfile::of_nodes(nodes);
    let total: Duration = kinds.iter().map(|p| p.total).sum();
    eprintln!("profile of {name} ({reps} runs):");
    for p in kinds {
        eprintln!(
            "  {:<20} {:>4} nodes {:>10.3} ms {:>6.1}%",
            p.kind,
            p.nodes,
            ms(p.total),
            100.0 * p.total.as_secs_f64() / total.as_secs_f64().max(1e-12)
        );
    }
    if each_node {
        eprintln!("nodes of {name}, ms per run:");
        for n in nodes {
            eprintln!("  {:>10.3} ms {:<20} {}", ms(n.total), n.kind, n.name);
        }
    }
}

/// A size field of this process's `/proc/self/status` in bytes (Linux),
/// if known: `VmHWM:` the peak resident set, `VmRSS:` the current one.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Size in bytes and parameter count of the model's tensors.
fn model_size(path: &Path) -> Result<(u64, u64)> {
    let file = MllmFile::open(path)?;
    let Some(meta) = file.metadata() else {
        return Ok((file.file_len(), 0));
    };
    let mut bytes = 0;
    let mut params = 0;
    for (name, shape) in &meta.tensors {
        bytes += file.entries()[name].len;
        params += shape.iter().product::<usize>() as u64;
    }
    Ok((bytes, params))
}

fn run(args: Args) -> Result<()> {
    if args.reps == 0 {
        return Err(Error::InvalidInput("-r must be at least 1".into()));
    }
    if args.batch == 0 {
        return Err(Error::InvalidInput("-b must be at least 1".into()));
    }
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::ensure_model()?,
    };
    let mut opts = LoadOptions {
        threads: args.threads,
        ..Default::default()
    };
    args.files.apply(&mut opts)?;
    args.backend.apply(&mut opts)?;
    let mut model = Model::load(&path, &opts)?;
    let quant_path = opts.quant_path.unwrap_or(QuantPath::Int16Activations);
    let loaded_rss = status_bytes("VmRSS:");
    let loaded_file_rss = status_bytes("RssFile:");
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        args.threads
    };
    let (size, params) = model_size(&path)?;
    let tests: Vec<Test> = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Test {
            n_prompt: n,
            n_gen: 0,
            batch: 1,
        })
        .chain(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| Test {
            n_prompt: 0,
            n_gen: n,
            batch: args.batch,
        }))
        .collect();
    for t in &tests {
        let needed = args.depth + t.n_prompt + t.n_gen;
        if needed > model.max_context() {
            return Err(Error::ContextFull {
                slot: 0,
                needed,
                limit: model.max_context(),
            });
        }
    }
    let model_name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut results = Vec::new();
    if !args.json {
        println!("| model | size | params | backend | threads | test | t/s |");
        println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
    }
    let profiling = args.profile || args.profile_nodes;
    for (i, test) in tests.iter().enumerate() {
        run_once(&mut model, *test, args.depth, i as u64, None)?;
        let mut profile = Vec::new();
        let mut samples_ns = Vec::with_capacity(args.reps);
        for r in 0..args.reps {
            let seed = (i * 1000 + r + 1) as u64;
            let timed = profiling.then_some(&mut profile);
            let d = run_once(&mut model, *test, args.depth, seed, timed)?;
            samples_ns.push(d.as_nanos() as f64);
        }
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|ns| test.tokens() as f64 * 1e9 / ns)
            .collect();
        let (avg_ns, stddev_ns) = mean_std(&samples_ns);
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        if args.json {
            results.push(json!({
                "model_filename": path.display().to_string(),
                "model_type": model.architecture(),
                "model_size": size,
                "model_n_params": params,
                "backends": "CPU",
                "cpu_info": machine::cpu_model().unwrap_or_default(),
                "kernel_level": machine::kernel_level(quant_path, opts.max_simd).to_string(),
                "n_threads": threads,
                "n_prompt": test.n_prompt,
                "n_gen": test.n_gen,
                "n_depth": args.depth,
                "n_batch": test.batch,
                "avg_ns": avg_ns.round() as u64,
                "stddev_ns": stddev_ns.round() as u64,
                "avg_ts": avg_ts,
                "stddev_ts": stddev_ts,
                "samples_ns": samples_ns.iter().map(|x| x.round() as u64).collect::<Vec<_>>(),
                "samples_ts": samples_ts,
            }));
        } else {
            println!(
                "| {model_name} | {:.2} MiB | {:.2} M | CPU | {threads} | {} | {avg_ts:.2} ± {stddev_ts:.2} |",
                size as f64 / (1024.0 * 1024.0),
                params as f64 / 1e6,
                test.name(args.depth),
            );
        }
        if profiling {
            let name = test.name(args.depth);
            print_profile(&name, args.reps, &profile, args.profile_nodes);
        }
    }
    let rss = status_bytes("VmHWM:");
    if args.json {
        for r in &mut results {
            r["peak_rss_bytes"] = json!(rss);
            r["rss_after_load_bytes"] = json!(loaded_rss);
            r["file_rss_after_load_bytes"] = json!(loaded_file_rss);
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&results).unwrap_or_default()
        );
    } else {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        if let (Some(rss), Some(file)) = (loaded_rss, loaded_file_rss) {
            println!(
                "\nRSS after load: {:.1} MiB ({:.1} MiB of it file pages)",
                mib(rss),
                mib(file)
            );
        }
        if let Some(rss) = rss {
            println!("peak RSS: {:.1} MiB", mib(rss));
        }
        println!("{}", machine::describe(quant_path, opts.max_simd));
    }
    Ok(())
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
