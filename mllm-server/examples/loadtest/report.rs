//! The load test's report: percentiles, the mismatch check against the
//! reference pass, the table and the JSON line.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::stream::Completed;
use crate::{Args, LoadResult, Outcome, Target, PROMPTS};

#[derive(Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub model: String,
    pub clients: usize,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub requests_issued: usize,
    pub requests_ok: usize,
    pub requests_failed: usize,
    pub requests_mismatched: usize,
    pub wall_s: f64,
    pub output_tokens: u64,
    pub aggregate_tokens_per_s: f64,
    ttft_ms_p50: Option<f64>,
    ttft_ms_p99: Option<f64>,
    itl_ms_p50: Option<f64>,
    itl_ms_p99: Option<f64>,
    tpot_ms_p50: Option<f64>,
    tpot_ms_p99: Option<f64>,
    pub single_client_decode_tokens_per_s: Option<f64>,
    pub aggregate_over_single: Option<f64>,
    pub first_error: Option<String>,
    pub first_mismatch: Option<String>,
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

pub fn build_report(
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

pub fn print_table(report: &Report) {
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
}
