//! Starting a server on the default model on 127.0.0.1 with an ephemeral
//! port, and small HTTP helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use mllm_convert::default_model;
use mllm_models::{LoadOptions, Model};
use mllm_server::engine::EngineConfig;
use mllm_server::ServerOptions;
use serde_json::Value;

/// The default model (fetched and converted once).
pub fn model_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| default_model::ensure_model().expect("fetch and convert the default model"))
}

/// Engine settings small enough for tests.
pub fn engine(parallel: usize, max_queue: usize) -> EngineConfig {
    EngineConfig {
        parallel,
        max_batch_tokens: 256,
        prefill_chunk: 64,
        max_queue,
    }
}

/// Starts a server for the default model with `ctx` tokens per sequence;
/// returns its base URL (`http://127.0.0.1:PORT`).
pub async fn start(engine: EngineConfig, ctx: usize, api_key: Option<&str>) -> String {
    let load = LoadOptions {
        threads: 2,
        max_context: Some(ctx),
        ..Default::default()
    };
    let model = Model::load(model_path(), &load).expect("load the default model");
    let app = mllm_server::build(
        model,
        ServerOptions {
            engine,
            api_key: api_key.map(str::to_string),
            model_id: "smollm2".into(),
        },
    )
    .expect("start the engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// An HTTP client that never uses a proxy.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// POSTs `body` as JSON.
async fn send(base: &str, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// POSTs `body` and returns the status and the JSON answer.
pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = send(base, path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// GETs `path` and returns the status and the body text.
pub async fn get(base: &str, path: &str) -> (u16, String) {
    let r = client().get(format!("{base}{path}")).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The data lines of a server-sent-events body, `[DONE]` included.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .map(str::to_string)
        })
        .collect()
}

/// POSTs a streaming request and returns its parsed chunks (without the
/// final `[DONE]`, which is checked to be there).
pub async fn post_stream(base: &str, path: &str, body: &Value) -> Vec<Value> {
    let r = send(base, path, body).await;
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = r.text().await.unwrap();
    let mut data = sse_data(&text);
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "{text}");
    data.iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The value of a metric line `name value` in a Prometheus text body.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse()
        .unwrap()
}

/// The text of a chat or text completion answer.
pub fn reply(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap_or_else(|| panic!("no reply in {v}"))
        .to_string()
}

/// The concatenated text of streamed chunks.
pub fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            let ch = c["choices"].get(0)?;
            ch["delta"]["content"].as_str().or(ch["text"].as_str())
        })
        .collect()
}
