//! Generate text (or token ids) from a `.mllm` model.
//!
//! ```text
//! cargo run --release --example generate -- --model m.mllm --prompt-ids 1,17,200 \
//!     --max-tokens 20 --print-ids --dump-logits prompt_logits.npy
//! ```
//!
//! `--dump-logits PATH` writes the logits of every prompt position as a
//! little-endian float32 `.npy` of shape `[n_prompt, vocab]`; `--print-ids`
//! prints the generated ids as one line `ids: a,b,c`. Both are stable
//! interfaces for parity checks.
//!
//! `--beams N` (N > 1) runs beam search instead of sampling, as transformers'
//! `generate(num_beams=N, do_sample=False)`: `--length-penalty`,
//! `--early-stopping false|true|never` and `--num-return K` as there. It
//! prints the K best hypotheses, best first, each as
//! `beam I score S: TEXT` (or `beam I score S ids: a,b,c` with `--print-ids`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use mllm::cli::SamplingArgs;
use mllm::core::npy::write_npy_f32;
use mllm::core::{Error, Result};
use mllm::models::chat::Message;
use mllm::models::tokenizer::TextStream;
use mllm::models::{
    beam_search, generate, BeamOptions, EarlyStopping, GenerateOptions, LoadOptions, Model,
};

#[derive(Parser, Debug)]
#[command(about = "Generate a continuation of a prompt with a .mllm model")]
struct Args {
    /// The .mllm model file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs a tokenizer in the model file).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt as raw token ids, comma-separated (e.g. 1,17,200).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as one user message in the model's chat template,
    /// ending with the assistant's generation prompt.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Most new tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Beam search with this many beams (1: sample or decode greedily).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    beams: u32,
    /// Beam search: a finished hypothesis scores its log-probability over
    /// its length to this power.
    #[arg(long, default_value_t = 1.0)]
    length_penalty: f32,
    /// Beam search: when to stop before every beam ends (false, true, never).
    #[arg(long, default_value = "false")]
    early_stopping: EarlyStopping,
    /// Beam search: how many hypotheses to print.
    #[arg(long, default_value_t = 1)]
    num_return: usize,
    /// Print the generated ids as one line `ids: a,b,c`.
    #[arg(long)]
    print_ids: bool,
    /// Write the logits of every prompt position to this .npy file.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    #[command(flatten)]
    backend: mllm::cli::BackendArgs,
    #[command(flatten)]
    files: mllm::cli::ModelFileArgs,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

fn run(args: Args) -> Result<()> {
    let mut opts = LoadOptions {
        threads: args.threads,
        ..Default::default()
    };
    args.files.apply(&mut opts)?;
    args.backend.apply(&mut opts)?;
    let mut model = Model::load(&args.model, &opts)?;
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) if args.chat => {
            let rendered = model
                .chat_template_renderer()?
                .render(&[Message::user(text)], true)?;
            model.require_tokenizer()?.encode(&rendered, false)?
        }
        (Some(text), None) => model.require_tokenizer()?.encode(text, true)?,
        (None, None) => return Err(Error::InvalidInput("give --prompt or --prompt-ids".into())),
    };
    let eos_ids = if args.ignore_eos {
        Vec::new()
    } else {
        model.eos_ids()
    };
    if args.beams > 1 {
        return run_beams(&args, &mut model, &prompt, eos_ids);
    }
    let gen_opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling.params(),
        eos_ids,
        keep_prompt_logits: args.dump_logits.is_some(),
    };
    let started = Instant::now();
    let mut first_token_at = None;
    let tokenizer = if args.print_ids {
        None
    } else {
        model.tokenizer()
    };
    let mut stream = tokenizer.as_deref().map(TextStream::new);
    let mut stdout = std::io::stdout();
    let mut on_token = |id: u32| -> Result<bool> {
        first_token_at.get_or_insert_with(Instant::now);
        if let Some(s) = stream.as_mut() {
            let piece = s.push(id)?;
            print!("{piece}");
            let _ = stdout.flush();
        }
        Ok(true)
    };
    let out = generate(&mut model, &prompt, &gen_opts, &mut on_token)?;
    let done = Instant::now();
    if stream.is_some() {
        println!();
    }
    if args.print_ids {
        let ids: Vec<String> = out.tokens.iter().map(u32::to_string).collect();
        println!("ids: {}", ids.join(","));
    }
    if let (Some(path), Some(logits)) = (&args.dump_logits, &out.prompt_logits) {
        write_npy_f32(path, logits.shape().dims(), logits.data())?;
        eprintln!(
            "wrote prompt logits {} to {}",
            logits.shape(),
            path.display()
        );
    }
    let first = first_token_at.unwrap_or(done);
    let prefill_s = (first - started).as_secs_f64();
    let decode_s = (done - first).as_secs_f64();
    let decoded = out.tokens.len().saturating_sub(1);
    eprintln!(
        "prompt {} tokens in {:.3}s ({:.1} tok/s), generated {} tokens ({:.1} tok/s), stop: {:?}",
        prompt.len(),
        prefill_s,
        prompt.len() as f64 / prefill_s.max(1e-9),
        out.tokens.len(),
        decoded as f64 / decode_s.max(1e-9),
        out.stop
    );
    Ok(())
}

/// Beam search from `prompt`; prints the hypotheses and the speed.
fn run_beams(args: &Args, model: &mut Model, prompt: &[u32], eos_ids: Vec<u32>) -> Result<()> {
    if args.sampling.temperature != 0.0 {
        return Err(Error::InvalidInput(
            "beam search does not sample: --temperature must be 0 with --beams".into(),
        ));
    }
    if args.dump_logits.is_some() {
        return Err(Error::InvalidInput(
            "--dump-logits is not available with --beams".into(),
        ));
    }
    let opts = BeamOptions {
        num_beams: args.beams as usize,
        max_tokens: args.max_tokens,
        length_penalty: args.length_penalty,
        early_stopping: args.early_stopping,
        num_return_sequences: args.num_return,
        eos_ids,
    };
    let started = Instant::now();
    let out = beam_search(model, prompt, &opts)?;
    let secs = started.elapsed().as_secs_f64();
    let tokenizer = if args.print_ids {
        None
    } else {
        model.tokenizer()
    };
    for (i, h) in out.hypotheses.iter().enumerate() {
        match &tokenizer {
            Some(t) => println!(
                "beam {i} score {:.6}: {}",
                h.score,
                t.decode(&h.tokens, true)?
            ),
            None => {
                let ids: Vec<String> = h.tokens.iter().map(u32::to_string).collect();
                println!("beam {i} score {:.6} ids: {}", h.score, ids.join(","));
            }
        }
    }
    eprintln!(
        "prompt {} tokens, {} steps of {} beams in {:.3}s ({:.1} beam tokens/s)",
        prompt.len(),
        out.steps,
        opts.num_beams,
        secs,
        (out.steps * opts.num_beams) as f64 / secs.max(1e-9)
    );
    Ok(())
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
