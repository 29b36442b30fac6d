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

mod report;
mod stream;

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use report::{build_report, print_table};
use stream::{discover_model, error_chain, request_until, Completed};

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

/// One load-pass request and how it ended.
struct Outcome {
    request: usize,
    prompt: usize,
    result: Result<Completed, String>,
}

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

#[tokio::main(flavor = "current_thread")]
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
