//! Load benchmark for the OpenAI-compatible `mllm-server`.
//!
//! ```text
//! cargo run --release -p mllm-server --example loadtest -- \
//!     --url http://127.0.0.1:8080 --clients 16 --requests 64 --max-tokens 64 \
//!     [--duration-s 300] [--ignore-eos true|false] [--model NAME] [--api-key KEY] [--json]
//! ```
//!
//! The benchmark runs two passes of streamed chat completions (`temperature: 0`,
//! `stream_options.include_usage: true`) against the server at `--url`:
//!
//! 1. **Reference pass**: each prompt of a fixed list once, sequentially, from a single
//!    client. The replies are kept as the expected output of every prompt, and the pass
//!    gives the single-client decode speed.
//! 2. **Load pass**: `--clients` concurrent clients take request numbers from a shared
//!    counter; request `i` uses prompt `i % prompts`. The pass stops issuing after
//!    `--requests` requests, or when `--duration-s` has elapsed (then in-flight requests
//!    get `--drain-timeout-s` more to finish). With `--duration-s` alone the request
//!    count is unbounded; with both, whichever limit comes first ends the pass.
//!
//! Greedy decoding does not depend on load, so every load-pass reply must equal the
//! reference reply of its prompt; a reply that differs is counted as *mismatched*
//! (a sign of mixed-up sequences in the batch) and the first one is printed.
//!
//! Reported: requests ok/failed/mismatched, wall time, aggregate output tokens/s,
//! time to first token (TTFT) and inter-token latency (ITL, time between content
//! chunks) percentiles, time per output token (TPOT), and the single-client decode
//! tokens/s with the ratio aggregate/single. `--json` prints one JSON object instead
//! of the table. The exit code is 1 if any request failed or mismatched.
//!
//! Only the given `--url` is contacted (system proxies are ignored).

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Short, distinct user prompts; request `i` uses `PROMPTS[i % PROMPTS.len()]`.
const PROMPTS: &[&str] = &[
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is the capital of Japan?",
    "Explain photosynthesis in one sentence.",
    "Name four colors of the rainbow.",
    "Give me one tip for learning to cook.",
    "Translate 'good morning' into Spanish.",
    "Describe a cat in five words.",
    "What is 12 times 12?",
    "Suggest a name for a pet goldfish.",
    "Why is the sky blue?",
    "Write one sentence about autumn leaves.",
    "What does a compiler do?",
    "Recommend a book for a long train ride.",
    "Tell me a fun fact about octopuses.",
    "How many days are in a leap year?",
    "Write the first line of a limerick about a frog.",
    "At what temperature does water boil in Celsius?",
];

#[derive(Parser, Debug)]
#[command(about = "Load benchmark for the OpenAI-compatible mllm-server")]
struct Args {
    /// Server base URL (without `/v1`).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Number of concurrent clients in the load pass.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Number of load-pass requests (default 64 unless `--duration-s` is given).
    #[arg(long)]
    requests: Option<usize>,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Stop issuing load-pass requests after this many seconds.
    #[arg(long)]
    duration_s: Option<f64>,
    /// Send `ignore_eos`, so that every request produces `max_tokens` tokens.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    ignore_eos: bool,
    /// Model name to request (default: the first model of `GET /v1/models`).
    #[arg(long)]
    model: Option<String>,
    /// Bearer token sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// Limit for one request, from sending it to the end of its stream.
    #[arg(long, default_value_t = 600.0)]
    request_timeout_s: f64,
    /// With `--duration-s`: how long in-flight requests may still run after it.
    #[arg(long, default_value_t = 120.0)]
    drain_timeout_s: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Where and what to request.
struct Target {
    base: String,
    model: String,
    api_key: Option<String>,
    max_tokens: u32,
    ignore_eos: bool,
}

impl Target {
    fn authorized(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    fn chat_request(&self, client: &reqwest::Client, prompt: &str) -> reqwest::RequestBuilder {
        let body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        self.authorized(client.post(format!("{}/v1/chat/completions", self.base)))
            .json(&body)
    }
}

/// The part of the final usage chunk that the benchmark needs.
#[derive(Debug, Deserialize)]
struct Usage {
    completion_tokens: u64,
}

/// A request whose stream completed with `[DONE]` and a usage chunk.
#[derive(Debug)]
struct Completed {
    text: String,
    /// Time from sending the request to the first non-empty content delta.
    ttft: Option<Duration>,
    /// Times between consecutive content chunks.
    itls: Vec<Duration>,
    /// Time from the first to the last content chunk.
    decode: Option<Duration>,
    completion_tokens: u64,
}

impl Completed {
    /// Mean time per output token after the first one.
    fn tpot(&self) -> Option<Duration> {
        let decode = self.decode?;
        let tokens = self.completion_tokens.checked_sub(1).filter(|&n| n > 0)?;
        (!decode.is_zero()).then(|| decode / tokens as u32)
    }
}

/// One load-pass request and how it ended.
struct Outcome {
    request: usize,
    prompt: usize,
    result: Result<Completed, String>,
}

// ---------------------------------------------------------------- SSE parsing

/// Incremental Server-Sent Events parser that yields the `data` of each event.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds raw body bytes; returns the payloads of the events they complete.
    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line =
                String::from_utf8(line).map_err(|_| "SSE line is not valid UTF-8".to_string())?;
            self.line(&line, &mut events);
        }
        Ok(events)
    }

    fn line(&mut self, line: &str, events: &mut Vec<String>) {
        if line.is_empty() {
            if self.has_data {
                events.push(std::mem::take(&mut self.data));
                self.has_data = false;
            }
        } else if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        // Comments (":...") and the fields event/id/retry are ignored.
    }
}

/// What a chat-completion stream has delivered so far.
struct StreamState {
    start: Instant,
    text: String,
    content_times: Vec<Instant>,
    usage: Option<Usage>,
    done: bool,
}

impl StreamState {
    fn new(start: Instant) -> Self {
        Self {
            start,
            text: String::new(),
            content_times: Vec::new(),
            usage: None,
            done: false,
        }
    }

    fn event(&mut self, data: &str, now: Instant) -> Result<(), String> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| format!("bad chunk JSON ({e}): {}", truncate(data, 200)))?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(format!("error event: {error}"));
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            let content = choice.pointer("/delta/content").and_then(Value::as_str);
            if let Some(content) = content.filter(|c| !c.is_empty()) {
                self.text.push_str(content);
                self.content_times.push(now);
            }
        }
        if let Some(raw) = chunk.get("usage").filter(|u| !u.is_null()) {
            let usage = Usage::deserialize(raw).map_err(|e| format!("bad usage ({e}): {raw}"))?;
            self.usage = Some(usage);
        }
        Ok(())
    }

    fn finish(self) -> Result<Completed, String> {
        if !self.done {
            return Err("stream ended without [DONE]".into());
        }
        let usage = self.usage.ok_or("stream had no usage chunk")?;
        let times = &self.content_times;
        Ok(Completed {
            ttft: times.first().map(|t| *t - self.start),
            itls: times.windows(2).map(|w| w[1] - w[0]).collect(),
            decode: times
                .first()
                .zip(times.last())
                .map(|(first, last)| *last - *first),
            completion_tokens: usage.completion_tokens,
            text: self.text,
        })
    }
}

// ------------------------------------------------------------------ requests

/// Sends one streamed chat completion and reads its stream to `[DONE]`.
async fn stream_chat(
    client: &reqwest::Client,
    target: &Target,
    prompt: &str,
) -> Result<Completed, String> {
    let start = Instant::now();
    let response = target
        .chat_request(client, prompt)
        .send()
        .await
        .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(|v| format!(" (Retry-After: {v})"))
            .unwrap_or_default();
        let body = response.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}{retry_after}: {}",
            truncate(&body, 300)
        ));
    }
    let mut parser = SseParser::default();
    let mut state = StreamState::new(start);
    let mut body = std::pin::pin!(response.bytes_stream());
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("stream error: {}", error_chain(&e)))?;
        let now = Instant::now();
        for event in parser.feed(&chunk)? {
            state.event(&event, now)?;
            if state.done {
                break;
            }
        }
        if state.done {
            break;
        }
    }
    state.finish()
}

/// [`stream_chat`] that gives up at `deadline`.
async fn request_until(
    client: &reqwest::Client,
    target: &Target,
    prompt: &str,
    deadline: Instant,
) -> Result<Completed, String> {
    let deadline = tokio::time::Instant::from_std(deadline);
    tokio::time::timeout_at(deadline, stream_chat(client, target, prompt))
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// The id of the first model served, from `GET /v1/models`.
async fn discover_model(client: &reqwest::Client, target: &Target) -> Result<String, String> {
    let url = format!("{}/v1/models", target.base);
    let response = target
        .authorized(client.get(url.as_str()))
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("GET {url}: HTTP {status}, bad JSON: {}", error_chain(&e)))?;
    body.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "GET {url}: HTTP {status}, no data[0].id in {}",
                truncate(&body.to_string(), 300)
            )
        })
}

// -------------------------------------------------------------------- passes

/// Each prompt once, sequentially; any failure is fatal.
async fn reference_pass(
    client: &reqwest::Client,
    target: &Target,
    request_timeout: Duration,
) -> Result<Vec<Completed>, String> {
    let mut replies = Vec::with_capacity(PROMPTS.len());
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let reply = request_until(client, target, prompt, Instant::now() + request_timeout)
            .await
            .map_err(|e| format!("reference request {i} ({prompt:?}) failed: {e}"))?;
        replies.push(reply);
    }
    Ok(replies)
}

/// When the load pass stops issuing requests and how long each may take.
struct LoadPlan {
    clients: usize,
    limit: Option<usize>,
    stop_issuing_at: Option<Instant>,
    hard_deadline: Option<Instant>,
    request_timeout: Duration,
}

impl LoadPlan {
    fn new(args: &Args, start: Instant) -> Self {
        let limit = match (args.requests, args.duration_s) {
            (Some(n), _) => Some(n),
            (None, None) => Some(64),
            (None, Some(_)) => None,
        };
        let stop_issuing_at = args.duration_s.map(|s| start + Duration::from_secs_f64(s));
        let drain = Duration::from_secs_f64(args.drain_timeout_s);
        Self {
            clients: args.clients,
            limit,
            stop_issuing_at,
            hard_deadline: stop_issuing_at.map(|t| t + drain),
            request_timeout: Duration::from_secs_f64(args.request_timeout_s),
        }
    }

    /// The number of the next request to issue, or `None` when the pass is over.
    fn next_request(&self, counter: &AtomicUsize) -> Option<usize> {
        if self.stop_issuing_at.is_some_and(|t| Instant::now() >= t) {
            return None;
        }
        let i = counter.fetch_add(1, Ordering::Relaxed);
        self.limit.is_none_or(|n| i < n).then_some(i)
    }

    fn deadline_for(&self, issued_at: Instant) -> Instant {
        let deadline = issued_at + self.request_timeout;
        self.hard_deadline
            .map_or(deadline, |hard| hard.min(deadline))
    }
}

async fn client_loop(
    client: reqwest::Client,
    target: Arc<Target>,
    plan: Arc<LoadPlan>,
    counter: Arc<AtomicUsize>,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    while let Some(request) = plan.next_request(&counter) {
        let prompt = request % PROMPTS.len();
        let deadline = plan.deadline_for(Instant::now());
        let result = request_until(&client, &target, PROMPTS[prompt], deadline).await;
        outcomes.push(Outcome {
            request,
            prompt,
            result,
        });
    }
    outcomes
}

struct LoadResult {
    outcomes: Vec<Outcome>,
    wall: Duration,
    lost_clients: usize,
}

async fn load_pass(client: &reqwest::Client, target: Arc<Target>, plan: LoadPlan) -> LoadResult {
    let counter = Arc::new(AtomicUsize::new(0));
    let plan = Arc::new(plan);
    let start = Instant::now();
    let handles: Vec<_> = (0..plan.clients)
        .map(|_| {
            let task = client_loop(
                client.clone(),
                target.clone(),
                plan.clone(),
                counter.clone(),
            );
            tokio::spawn(task)
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut lost_clients = 0;
    for handle in handles {
        match handle.await {
            Ok(mut client_outcomes) => outcomes.append(&mut client_outcomes),
            Err(e) => {
                eprintln!("client task failed: {e}");
                lost_clients += 1;
            }
        }
    }
    let wall = start.elapsed();
    outcomes.sort_by_key(|o| o.request);
    LoadResult {
        outcomes,
        wall,
        lost_clients,
    }
}

// ------------------------------------------------------------------- report

#[derive(Debug, Serialize)]
struct Report {
    url: String,
    model: String,
    clients: usize,
    max_tokens: u32,
    ignore_eos: bool,
    requests_issued: usize,
    requests_ok: usize,
    requests_failed: usize,
    requests_mismatched: usize,
    wall_s: f64,
    output_tokens: u64,
    aggregate_tokens_per_s: f64,
    ttft_ms_p50: Option<f64>,
    ttft_ms_p99: Option<f64>,
    itl_ms_p50: Option<f64>,
    itl_ms_p99: Option<f64>,
    tpot_ms_p50: Option<f64>,
    tpot_ms_p99: Option<f64>,
    single_client_decode_tokens_per_s: Option<f64>,
    aggregate_over_single: Option<f64>,
    first_error: Option<String>,
    first_mismatch: Option<String>,
}

/// Nearest-rank percentile of an ascending slice; `None` when it is empty.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50 and p99 of durations, in milliseconds.
fn p50_p99_ms(durations: impl IntoIterator<Item = Duration>) -> (Option<f64>, Option<f64>) {
    let mut ms: Vec<f64> = durations
        .into_iter()
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 50.0), percentile(&ms, 99.0))
}

/// Decode speed of the reference pass: tokens after the first over the time they took.
fn decode_tokens_per_s(replies: &[Completed]) -> Option<f64> {
    let (tokens, secs) = replies
        .iter()
        .filter_map(|r| Some((r.completion_tokens.checked_sub(1)?, r.decode?)))
        .fold((0u64, 0f64), |(n, s), (tokens, decode)| {
            (n + tokens, s + decode.as_secs_f64())
        });
    (secs > 0.0 && tokens > 0).then(|| tokens as f64 / secs)
}

/// Describes where `got` first differs from `expected`.
fn describe_mismatch(outcome: &Outcome, expected: &str, got: &str) -> String {
    let at = expected
        .chars()
        .zip(got.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let snippet = |s: &str| -> String { s.chars().skip(at.saturating_sub(20)).take(60).collect() };
    format!(
        "request {} (prompt {} {:?}): reply differs at char {at} \
         (expected {} chars, got {})\n  expected: {:?}\n  got:      {:?}",
        outcome.request,
        outcome.prompt,
        PROMPTS[outcome.prompt],
        expected.chars().count(),
        got.chars().count(),
        snippet(expected),
        snippet(got),
    )
}

fn build_report(
    args: &Args,
    target: &Target,
    reference: &[Completed],
    load: &LoadResult,
) -> Report {
    let mut completed = Vec::new();
    let mut errors = Vec::new();
    let mut mismatched = 0;
    let mut first_mismatch = None;
    for outcome in &load.outcomes {
        match &outcome.result {
            Ok(reply) => {
                let expected = &reference[outcome.prompt].text;
                if reply.text != *expected {
                    mismatched += 1;
                    if first_mismatch.is_none() {
                        first_mismatch = Some(describe_mismatch(outcome, expected, &reply.text));
                    }
                }
                completed.push(reply);
            }
            Err(e) => errors.push(format!("request {}: {e}", outcome.request)),
        }
    }
    report_errors(&errors);

    let output_tokens: u64 = completed.iter().map(|r| r.completion_tokens).sum();
    let wall_s = load.wall.as_secs_f64();
    let aggregate = if wall_s > 0.0 {
        output_tokens as f64 / wall_s
    } else {
        0.0
    };
    let single = decode_tokens_per_s(reference);
    let (ttft_ms_p50, ttft_ms_p99) = p50_p99_ms(completed.iter().filter_map(|r| r.ttft));
    let (itl_ms_p50, itl_ms_p99) =
        p50_p99_ms(completed.iter().flat_map(|r| r.itls.iter().copied()));
    let (tpot_ms_p50, tpot_ms_p99) = p50_p99_ms(completed.iter().filter_map(|r| r.tpot()));
    Report {
        url: args.url.clone(),
        model: target.model.clone(),
        clients: args.clients,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        requests_issued: load.outcomes.len(),
        requests_ok: completed.len() - mismatched,
        requests_failed: errors.len() + load.lost_clients,
        requests_mismatched: mismatched,
        wall_s,
        output_tokens,
        aggregate_tokens_per_s: aggregate,
        ttft_ms_p50,
        ttft_ms_p99,
        itl_ms_p50,
        itl_ms_p99,
        tpot_ms_p50,
        tpot_ms_p99,
        single_client_decode_tokens_per_s: single,
        aggregate_over_single: single.filter(|s| *s > 0.0).map(|s| aggregate / s),
        first_error: errors.into_iter().next(),
        first_mismatch,
    }
}

/// Prints the most frequent failure messages (without request numbers) to stderr.
fn report_errors(errors: &[String]) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in errors {
        let message = e.split_once(": ").map_or(e.as_str(), |(_, m)| m);
        *counts.entry(message).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    for (message, count) in counts.iter().take(5) {
        eprintln!("failed x{count}: {message}");
    }
    if counts.len() > 5 {
        eprintln!("... and {} other failure messages", counts.len() - 5);
    }
}

fn fmt_opt(value: Option<f64>, precision: usize) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| format!("{v:.precision$}"))
}

fn print_table(report: &Report) {
    let r = report;
    println!("mllm-server load test: {} (model {})", r.url, r.model);
    println!("  clients                 {}", r.clients);
    println!(
        "  max_tokens / ignore_eos {} / {}",
        r.max_tokens, r.ignore_eos
    );
    println!(
        "  requests                {} issued: {} ok, {} failed, {} mismatched",
        r.requests_issued, r.requests_ok, r.requests_failed, r.requests_mismatched
    );
    println!("  wall time               {:.2} s", r.wall_s);
    println!("  output tokens           {}", r.output_tokens);
    println!("  aggregate tokens/s      {:.1}", r.aggregate_tokens_per_s);
    println!(
        "  TTFT p50 / p99          {} / {} ms",
        fmt_opt(r.ttft_ms_p50, 1),
        fmt_opt(r.ttft_ms_p99, 1)
    );
    println!(
        "  ITL  p50 / p99          {} / {} ms",
        fmt_opt(r.itl_ms_p50, 2),
        fmt_opt(r.itl_ms_p99, 2)
    );
    println!(
        "  TPOT p50 / p99          {} / {} ms",
        fmt_opt(r.tpot_ms_p50, 2),
        fmt_opt(r.tpot_ms_p99, 2)
    );
    println!(
        "  single-client decode    {} tokens/s",
        fmt_opt(r.single_client_decode_tokens_per_s, 1)
    );
    println!(
        "  aggregate / single      {}x",
        fmt_opt(r.aggregate_over_single, 2)
    );
}

// -------------------------------------------------------------------- helpers

/// An error with its chain of sources, e.g. "error sending request: connection refused".
fn error_chain(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}...", &s[..end]),
        None => s.to_string(),
    }
}

fn validate(args: &Args) -> Result<(), String> {
    let positive = |name: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(format!("--{name} must be positive"))
        }
    };
    if args.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if args.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    if args.requests == Some(0) {
        return Err("--requests must be at least 1".into());
    }
    if let Some(d) = args.duration_s {
        positive("duration-s", d)?;
    }
    positive("request-timeout-s", args.request_timeout_s)?;
    positive("drain-timeout-s", args.drain_timeout_s)
}

/// Accepts the base URL with or without a trailing `/` or `/v1`.
fn base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    url.strip_suffix("/v1").unwrap_or(url).to_string()
}

async fn run(args: Args) -> Result<bool, String> {
    validate(&args)?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build HTTP client: {}", error_chain(&e)))?;
    let mut target = Target {
        base: base_url(&args.url),
        model: String::new(),
        api_key: args.api_key.clone(),
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
    };
    target.model = match &args.model {
        Some(model) => model.clone(),
        None => discover_model(&client, &target).await?,
    };
    let request_timeout = Duration::from_secs_f64(args.request_timeout_s);

    eprintln!("reference pass: {} prompts, 1 client", PROMPTS.len());
    let reference = reference_pass(&client, &target, request_timeout).await?;
    eprintln!("load pass: {} clients", args.clients);
    let target = Arc::new(target);
    let plan = LoadPlan::new(&args, Instant::now());
    let load = load_pass(&client, target.clone(), plan).await;

    let report = build_report(&args, &target, &reference, &load);
    if let Some(mismatch) = &report.first_mismatch {
        eprintln!("first mismatch: {mismatch}");
    }
    if args.json {
        let line = serde_json::to_string(&report).map_err(|e| format!("cannot write JSON: {e}"))?;
        println!("{line}");
    } else {
        print_table(&report);
    }
    Ok(report.requests_failed == 0 && report.requests_mismatched == 0)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("loadtest: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn sse_parser_splits_events_across_chunks() {
        let mut parser = SseParser::default();
        assert!(parser.feed(b"data: {\"a\":").unwrap().is_empty());
        let events = parser
            .feed(b"1}\r\n\r\n: comment\n\ndata: [DONE]\n\n")
            .unwrap();
        assert_eq!(events, vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]);
    }

    #[test]
    fn stream_state_collects_text_and_usage() {
        let start = Instant::now();
        let mut state = StreamState::new(start);
        let chunk = r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        state.event(chunk, start).unwrap();
        let usage =
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        state.event(usage, start).unwrap();
        state.event("[DONE]", start).unwrap();
        let done = state.finish().unwrap();
        assert_eq!(done.text, "Hi");
        assert_eq!(done.completion_tokens, 2);
        assert!(done.ttft.is_some());
    }

    #[test]
    fn stream_without_done_fails() {
        let state = StreamState::new(Instant::now());
        assert!(state.finish().is_err());
    }
}
