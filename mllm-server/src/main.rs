//! `mllm-server`: serve a model over an OpenAI-compatible HTTP API.
//!
//! ```text
//! cargo run --release -p mllm-server                    # default model on 127.0.0.1:8080
//! cargo run --release -p mllm-server -- --model m.mllm --port 9000 --parallel 16
//! ```

use std::process::ExitCode;

use clap::Parser;
use mllm_convert::default_model;
use mllm_models::{LoadOptions, Model};
use mllm_server::args::{Args, DEFAULT_MAX_CTX};
use mllm_server::ServerOptions;

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    args.engine().validate()?;
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::ensure_model().map_err(|e| e.to_string())?,
    };
    let mut load = LoadOptions {
        threads: args.threads,
        max_context: Some(args.ctx.unwrap_or(DEFAULT_MAX_CTX)),
        ..Default::default()
    };
    args.files.apply(&mut load).map_err(|e| e.to_string())?;
    args.backend.apply(&mut load).map_err(|e| e.to_string())?;
    if args.ctx == Some(0) {
        return Err("--ctx must be at least 1".into());
    }
    let model = Model::load(&path, &load).map_err(|e| format!("{}: {e}", path.display()))?;
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
    });
    let context = model.max_context();
    let opts = ServerOptions {
        engine: args.engine(),
        api_key: args.api_key.clone(),
        model_id: model_id.clone(),
    };
    let app = mllm_server::build(model, opts)?;
    // One thread serves HTTP: the work per token is small, and every other
    // core is the engine's (threads of a busy runtime would preempt the
    // compute workers and stall whole steps).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "serving {model_id} ({context} tokens per sequence, {} in parallel) on http://{local}/",
            args.parallel
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| format!("server error: {e}"))
    })
}
