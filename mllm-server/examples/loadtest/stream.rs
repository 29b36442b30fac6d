//! Reading one streamed chat completion: the request, the server-sent
//! events parser, and what a finished stream delivered.

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use crate::Target;

/// The part of the final usage chunk that the benchmark needs.
#[derive(Debug, Deserialize)]
struct Usage {
    pub completion_tokens: u64,
}

/// A request whose stream completed with `[DONE]` and a usage chunk.
#[derive(Debug)]
pub struct Completed {
    pub text: String,
    /// Time from sending the request to the first non-empty content delta.
    pub ttft: Option<Duration>,
    /// Times between consecutive content chunks.
    pub itls: Vec<Duration>,
    /// Time from the first to the last content chunk.
    pub decode: Option<Duration>,
    pub completion_tokens: u64,
}

impl Completed {
    /// Mean time per output token after the first one.
    pub fn tpot(&self) -> Option<Duration> {
        let decode = self.decode?;
        let tokens = self.completion_tokens.checked_sub(1).filter(|&n| n > 0)?;
        (!decode.is_zero()).then(|| decode / tokens as u32)
    }
}

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
pub async fn request_until(
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
pub async fn discover_model(client: &reqwest::Client, target: &Target) -> Result<String, String> {
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

/// An error with its chain of sources, e.g. "error sending request: connection refused".
pub fn error_chain(error: &dyn StdError) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
