//! Parsing and validating OpenAI request bodies. Every problem becomes an
//! [`ApiError`] naming the field; nothing here panics on input.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use mllm_models::chat::Message;
use mllm_models::SamplingParams;

use super::error::ApiError;

/// A string or a list of strings (`stop`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the token usage.
    pub include_usage: Option<bool>,
}

/// Parameters shared by chat and text completions.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CommonParams {
    /// The model id (the served id or `default`).
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Same as `max_tokens` (newer OpenAI name; wins when both are given).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature in [0, 2]; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (0 or less: off).
    pub top_k: Option<i64>,
    /// Drop tokens below this fraction of the top probability.
    pub min_p: Option<f32>,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// Multiplicative repetition penalty (> 0; 1 is off).
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    /// Seed of the sampler.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<OneOrMany>,
    /// Stream the reply as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Number of choices (only 1 is supported).
    pub n: Option<u64>,
    /// Keep generating after end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
}

/// A chat message as clients send it.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// Text, or a list of parts of which only text parts are supported.
    pub content: Option<Value>,
}

/// The fields only chat completions have.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatFields {
    /// The conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Return log-probabilities of the generated tokens.
    pub logprobs: Option<bool>,
    /// Alternatives per position (0 to 20; needs `logprobs`).
    pub top_logprobs: Option<u64>,
}

/// A text prompt or token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids used as they are.
    Ids(Vec<u32>),
}

/// The fields only text completions have.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionFields {
    /// A string, a list of token ids, or a list with one of either.
    pub prompt: Option<Value>,
    /// Return log-probabilities of the generated tokens and this many
    /// alternatives (0 to 20).
    pub logprobs: Option<u64>,
}

/// Most stop strings per request.
pub const MAX_STOP: usize = 16;
/// Most alternatives per position for log-probabilities.
pub const MAX_TOP_LOGPROBS: u64 = 20;

/// Parses a JSON body: malformed JSON and fields of the wrong type become
/// 400 errors naming the problem or the field.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// Reads the fields of `T` from a parsed body.
pub fn fields<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_field(
            path.clone(),
            format!("invalid value for `{path}`: {}", e.inner()),
        )
    })
}

/// Validated settings shared by both completion routes.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Sampler settings.
    pub sampling: SamplingParams,
    /// Most tokens to generate, when given.
    pub max_tokens: Option<usize>,
    /// OpenAI presence penalty.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty.
    pub frequency_penalty: f32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream the reply.
    pub stream: bool,
    /// Send usage in the last streamed chunk.
    pub include_usage: bool,
    /// Keep generating after end-of-sequence tokens.
    pub ignore_eos: bool,
}

fn check_range(name: &str, v: f32, lo: f32, hi: f32, lo_open: bool) -> Result<f32, ApiError> {
    let above = if lo_open { v > lo } else { v >= lo };
    if v.is_finite() && above && v <= hi {
        Ok(v)
    } else {
        let open = if lo_open { "(" } else { "[" };
        Err(ApiError::bad_field(
            name,
            format!("`{name}` must be in {open}{lo}, {hi}], got {v}"),
        ))
    }
}

impl CommonParams {
    /// Checks every field and returns the settings; `seed` is drawn at
    /// random when not given.
    pub fn settings(&self) -> Result<Settings, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::bad_field(
                    "n",
                    format!("only n = 1 is supported, got {n}"),
                ));
            }
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => Some(("max_completion_tokens", m)),
            (None, Some(m)) => Some(("max_tokens", m)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((name, 0)) => {
                return Err(ApiError::bad_field(
                    name,
                    format!("`{name}` must be at least 1"),
                ))
            }
            Some((_, m)) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => None,
        };
        let temperature = check_range(
            "temperature",
            self.temperature.unwrap_or(1.0),
            0.0,
            2.0,
            false,
        )?;
        let top_p = check_range("top_p", self.top_p.unwrap_or(1.0), 0.0, 1.0, true)?;
        let min_p = check_range("min_p", self.min_p.unwrap_or(0.0), 0.0, 1.0, false)?;
        let presence_penalty = check_range(
            "presence_penalty",
            self.presence_penalty.unwrap_or(0.0),
            -2.0,
            2.0,
            false,
        )?;
        let frequency_penalty = check_range(
            "frequency_penalty",
            self.frequency_penalty.unwrap_or(0.0),
            -2.0,
            2.0,
            false,
        )?;
        let repetition_penalty = check_range(
            "repetition_penalty",
            self.repetition_penalty.unwrap_or(1.0),
            0.0,
            10.0,
            true,
        )?;
        let top_k = usize::try_from(self.top_k.unwrap_or(0).max(0)).unwrap_or(usize::MAX);
        let seed = match self.seed {
            Some(s) => s as u64,
            None => rand::random(),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP {
            return Err(ApiError::bad_field(
                "stop",
                format!(
                    "at most {MAX_STOP} stop strings are allowed, got {}",
                    stop.len()
                ),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_field(
                "stop",
                "stop strings must not be empty",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(Settings {
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                seed,
            },
            max_tokens,
            presence_penalty,
            frequency_penalty,
            stop,
            stream,
            include_usage: stream
                && self
                    .stream_options
                    .as_ref()
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
        })
    }
}

impl ChatFields {
    /// The conversation as template messages.
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        let messages = self
            .messages
            .as_ref()
            .ok_or_else(|| ApiError::bad_field("messages", "`messages` is required"))?;
        if messages.is_empty() {
            return Err(ApiError::bad_field(
                "messages",
                "`messages` must not be empty",
            ));
        }
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => {
                        return Err(ApiError::bad_field(
                            format!("messages[{i}].role"),
                            format!("unsupported role `{other}` (use system, user or assistant)"),
                        ))
                    }
                };
                Ok(Message::new(role, message_text(i, m.content.as_ref())?))
            })
            .collect()
    }

    /// How many alternatives to report per token, when log-probabilities
    /// are asked for.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = self.top_logprobs.unwrap_or(0);
        if top > MAX_TOP_LOGPROBS {
            return Err(ApiError::bad_field(
                "top_logprobs",
                format!("`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {top}"),
            ));
        }
        match self.logprobs.unwrap_or(false) {
            true => Ok(Some(top as usize)),
            false if self.top_logprobs.is_some_and(|t| t > 0) => Err(ApiError::bad_field(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            )),
            false => Ok(None),
        }
    }
}

/// The text of message `i`: a string, or the concatenated text parts.
fn message_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    let param = || format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::bad_field(
                            param(),
                            "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_field(
            param(),
            "content must be a string or a list of text parts",
        )),
    }
}

impl CompletionFields {
    /// The prompt: a string, token ids, or a list holding one of either.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        let bad = |msg: &str| ApiError::bad_field("prompt", msg.to_string());
        let value = self
            .prompt
            .as_ref()
            .ok_or_else(|| bad("`prompt` is required"))?;
        let value = match value {
            Value::Array(items) if items.len() == 1 && !items[0].is_number() => &items[0],
            Value::Array(items) if items.len() > 1 && !items[0].is_number() => {
                return Err(bad("only one prompt per request is supported"))
            }
            v => v,
        };
        match value {
            Value::String(s) if s.is_empty() => Err(bad("`prompt` must not be empty")),
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(ids) if ids.is_empty() => Err(bad("`prompt` must not be empty")),
            Value::Array(ids) => ids
                .iter()
                .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>()
                .map(Prompt::Ids)
                .ok_or_else(|| bad("token ids must be integers in 0..2^32")),
            _ => Err(bad("`prompt` must be a string or a list of token ids")),
        }
    }

    /// How many alternatives to report per token, when asked for.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::bad_field(
                "logprobs",
                format!("`logprobs` must be at most {MAX_TOP_LOGPROBS}, got {n}"),
            )),
            Some(n) => Ok(Some(n as usize)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(body: Value) -> Result<Settings, ApiError> {
        fields::<CommonParams>(&body)?.settings()
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let e = settings(json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = settings(json!({"top_p": 0})).unwrap_err();
        assert_eq!(e.message, "`top_p` must be in (0, 1], got 0");
        let e = settings(json!({"stream_options": {"include_usage": 3}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options.include_usage"));
        let e = settings(json!({"n": 2})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = settings(json!({"max_tokens": 0})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = settings(json!({"stop": ["a", 3]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(parse_body(b"{\"a\": ")
            .unwrap_err()
            .message
            .starts_with("malformed JSON"));
        assert!(parse_body(b"[1]").is_err());
    }

    #[test]
    fn defaults_and_aliases() {
        let s = settings(
            json!({"temperature": 0, "repeat_penalty": 1.1, "seed": 5, "stop": "x",
            "max_tokens": 9, "max_completion_tokens": 7, "stream": true,
            "stream_options": {"include_usage": true}, "unknown_field": [1]}),
        )
        .unwrap();
        assert_eq!(s.sampling.temperature, 0.0);
        assert_eq!(s.sampling.repetition_penalty, 1.1);
        assert_eq!(s.sampling.seed, 5);
        assert_eq!(s.stop, vec!["x".to_string()]);
        assert_eq!(s.max_tokens, Some(7));
        assert!(s.stream && s.include_usage);
    }

    #[test]
    fn messages_and_prompts() {
        let chat: ChatFields = fields(&json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]}))
        .unwrap();
        let m = chat.messages().unwrap();
        assert_eq!(m[0], Message::new("system", "be brief"));
        assert_eq!(m[1], Message::user("ab"));
        let empty: ChatFields = fields(&json!({"messages": []})).unwrap();
        assert_eq!(
            empty.messages().unwrap_err().message,
            "`messages` must not be empty"
        );
        let tool: ChatFields =
            fields(&json!({"messages": [{"role": "tool", "content": "x"}]})).unwrap();
        assert_eq!(
            tool.messages().unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
        let p = |v: Value| {
            fields::<CompletionFields>(&json!({ "prompt": v }))
                .unwrap()
                .prompt()
        };
        assert_eq!(p(json!("hi")).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(p(json!([1, 2])).unwrap(), Prompt::Ids(vec![1, 2]));
        assert_eq!(p(json!(["hi"])).unwrap(), Prompt::Text("hi".into()));
        assert!(p(json!([-1])).is_err());
        assert!(p(json!("")).is_err());
        assert!(p(json!(["a", "b"])).is_err());
    }
}
