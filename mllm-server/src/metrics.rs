//! Server counters and latency histograms, rendered in the Prometheus text
//! format at `GET /metrics`. Shared by the HTTP layer and the engine.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A latency histogram with fixed bucket bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Default)]
struct HistogramState {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new(HistogramState {
                counts: vec![0; bounds.len()],
                ..Default::default()
            }),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            s.counts[i] += 1;
        }
        s.sum += secs;
        s.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&s.counts) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum {}", s.sum);
        let _ = writeln!(out, "{name}_count {}", s.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Everything `/metrics` reports.
pub struct Metrics {
    /// HTTP requests to the generation routes.
    pub requests: AtomicU64,
    /// Requests answered with an error status.
    pub request_errors: AtomicU64,
    /// Requests turned away because the queue was full.
    pub rejected_queue_full: AtomicU64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV entries were reused (from a free slot or
    /// copied from a running sequence).
    pub prefix_reused_tokens: AtomicU64,
    /// The part of `prefix_reused_tokens` copied from running sequences.
    pub prefix_copied_tokens: AtomicU64,
    /// Generated tokens.
    pub completion_tokens: AtomicU64,
    /// Sequences ended because their client went away.
    pub cancelled: AtomicU64,
    /// Engine steps run.
    pub steps: AtomicU64,
    /// Tokens fed to the model over all steps.
    pub step_tokens: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_length: AtomicU64,
    /// Sequences holding a slot.
    pub active_sequences: AtomicU64,
    /// Time from a request's arrival to its first token.
    pub time_to_first_token: Histogram,
    /// Time between consecutive tokens of one sequence.
    pub inter_token_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            request_errors: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            prefix_reused_tokens: AtomicU64::new(0),
            prefix_copied_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_tokens: AtomicU64::new(0),
            queue_length: AtomicU64::new(0),
            active_sequences: AtomicU64::new(0),
            time_to_first_token: Histogram::new(TTFT_BOUNDS),
            inter_token_latency: Histogram::new(ITL_BOUNDS),
        }
    }
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters: [(&str, &str, &AtomicU64); 10] = [
            (
                "mllm_requests_total",
                "Requests to the generation routes.",
                &self.requests,
            ),
            (
                "mllm_request_errors_total",
                "Generation requests answered with an error.",
                &self.request_errors,
            ),
            (
                "mllm_rejected_queue_full_total",
                "Requests turned away with 503 because the queue was full.",
                &self.rejected_queue_full,
            ),
            (
                "mllm_prompt_tokens_total",
                "Prompt tokens of admitted requests (tokens in).",
                &self.prompt_tokens,
            ),
            (
                "mllm_prefix_reused_tokens_total",
                "Prompt tokens not prefilled because a slot already held them.",
                &self.prefix_reused_tokens,
            ),
            (
                "mllm_prefix_copied_tokens_total",
                "Reused prompt tokens copied from the slot of a running sequence.",
                &self.prefix_copied_tokens,
            ),
            (
                "mllm_completion_tokens_total",
                "Generated tokens (tokens out).",
                &self.completion_tokens,
            ),
            (
                "mllm_cancelled_total",
                "Sequences ended early because the client disconnected.",
                &self.cancelled,
            ),
            ("mllm_steps_total", "Engine steps run.", &self.steps),
            (
                "mllm_step_tokens_total",
                "Tokens fed to the model over all steps.",
                &self.step_tokens,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(c)
            );
        }
        let gauges: [(&str, &str, &AtomicU64); 2] = [
            (
                "mllm_queue_length",
                "Requests waiting for a slot.",
                &self.queue_length,
            ),
            (
                "mllm_active_sequences",
                "Sequences holding a KV-cache slot.",
                &self.active_sequences,
            ),
        ];
        for (name, help, g) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                get(g)
            );
        }
        self.time_to_first_token.render(
            &mut out,
            "mllm_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "mllm_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one sequence.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.time_to_first_token.observe(Duration::from_millis(20));
        m.time_to_first_token.observe(Duration::from_millis(300));
        m.time_to_first_token.observe(Duration::from_secs(100));
        add(&m.completion_tokens, 5);
        let text = m.render();
        assert!(text.contains("mllm_completion_tokens_total 5\n"), "{text}");
        assert!(text.contains("mllm_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
        assert!(text.contains("mllm_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(text.contains("mllm_time_to_first_token_seconds_bucket{le=\"60\"} 2\n"));
        assert!(text.contains("mllm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("mllm_time_to_first_token_seconds_count 3\n"));
    }
}
