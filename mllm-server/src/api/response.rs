//! Response bodies and stream chunks in OpenAI's shapes.

use serde_json::{json, Value};

use mllm_models::Tokenizer;

use crate::engine::{TokenLogprob, Usage};

/// Which route a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// What every response of one request shares.
#[derive(Clone, Debug)]
pub struct Header {
    /// The response id (`chatcmpl-N` or `cmpl-N`).
    pub id: String,
    /// Unix time the request arrived.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The route.
    pub kind: Kind,
}

impl Header {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn with_choices(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "mllm-rs",
            "choices": choices,
        })
    }

    /// The complete (non-streamed) response.
    pub fn complete(
        &self,
        text: &str,
        logprobs: Option<Value>,
        finish_reason: &str,
        usage: &Usage,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }),
            Kind::Text => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }),
        };
        let mut body = self.with_choices(false, json!([choice]));
        body["usage"] = usage_json(usage);
        body
    }

    /// A stream chunk with new text (`first` adds the assistant role for
    /// chat) and, at the end, the finish reason.
    pub fn chunk(
        &self,
        text: &str,
        logprobs: Option<Value>,
        finish_reason: Option<&str>,
        first: bool,
    ) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (first, finish_reason) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, Some(_)) if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason})
            }
            Kind::Text => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason})
            }
        };
        self.with_choices(true, json!([choice]))
    }

    /// The last stream chunk when usage is asked for: no choices, the usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let mut body = self.with_choices(true, json!([]));
        body["usage"] = usage_json(usage);
        body
    }
}

/// OpenAI's `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Log-probabilities in the route's format: chat's `{"content": [...]}`
/// with token strings and bytes, or the text route's parallel lists.
pub fn logprobs_json(kind: Kind, tokens: &[TokenLogprob], tokenizer: &Tokenizer) -> Value {
    let piece = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
    match kind {
        Kind::Chat => {
            let entry = |id: u32, lp: f32| {
                let t = piece(id);
                json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
            };
            let content: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let mut e = entry(t.id, t.logprob);
                    e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                    e
                })
                .collect();
            json!({ "content": content })
        }
        Kind::Text => {
            let pieces: Vec<String> = tokens.iter().map(|t| piece(t.id)).collect();
            let mut offset = 0;
            let offsets: Vec<usize> = pieces
                .iter()
                .map(|p| {
                    let at = offset;
                    offset += p.len();
                    at
                })
                .collect();
            let top: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let map: serde_json::Map<String, Value> = t
                        .top
                        .iter()
                        .map(|&(id, lp)| (piece(id), json!(lp)))
                        .collect();
                    Value::Object(map)
                })
                .collect();
            json!({
                "tokens": pieces,
                "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: Kind) -> Header {
        Header {
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
            kind,
        }
    }

    #[test]
    fn chat_chunks_carry_the_role_first_and_an_empty_delta_last() {
        let h = header(Kind::Chat);
        let first = h.chunk("", None, None, true);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let last = h.chunk("", None, Some("stop"), false);
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
        };
        let u = h.usage_chunk(&usage);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 5);
        let done = header(Kind::Text).complete("hi", None, "length", &usage);
        assert_eq!(done["object"], "text_completion");
        assert_eq!(done["choices"][0]["text"], "hi");
        assert_eq!(done["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }
}
