//! The sampling keyword arguments shared by `generate`, `stream`, `chat`
//! and `generate_batch`, and the generation loop they drive.

use mllm_core::Result;
use mllm_models::text::{IncrementalDecoder, StopMatcher};
use mllm_models::{generate, GenerateOptions, Model, SamplingParams, Tokenizer};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors::InvalidInputError;

/// Tokens generated when `max_tokens` is not given.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// The keyword arguments a generation call accepts.
pub const KEYWORDS: [&str; 9] = [
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
];

/// What to generate and how.
#[derive(Clone, Debug)]
pub struct Sampling {
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Stop strings: the text ends before the first one produced.
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
}

impl Sampling {
    /// Reads the keyword arguments (every one optional); an unknown one or
    /// a value of the wrong type is an `InvalidInputError` naming it.
    pub fn from_kwargs(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut s = Sampling {
            max_tokens: DEFAULT_MAX_TOKENS,
            params: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
        };
        let Some(kwargs) = kwargs else {
            return Ok(s);
        };
        for (key, value) in kwargs.iter() {
            let key: String = key.extract()?;
            let bad = |want: &str| {
                InvalidInputError::new_err(format!("{key} must be {want}, not {value}"))
            };
            if value.is_none() {
                continue;
            }
            match key.as_str() {
                "max_tokens" => s.max_tokens = value.extract().map_err(|_| bad("an int >= 0"))?,
                "temperature" => {
                    s.params.temperature = value.extract().map_err(|_| bad("a float"))?
                }
                "top_k" => s.params.top_k = value.extract().map_err(|_| bad("an int >= 0"))?,
                "top_p" => s.params.top_p = value.extract().map_err(|_| bad("a float"))?,
                "min_p" => s.params.min_p = value.extract().map_err(|_| bad("a float"))?,
                "repetition_penalty" => {
                    s.params.repetition_penalty = value.extract().map_err(|_| bad("a float"))?
                }
                "seed" => s.params.seed = value.extract().map_err(|_| bad("an int >= 0"))?,
                "stop" => {
                    s.stop = stop_strings(&value).map_err(|_| bad("a str or a list of str"))?
                }
                "ignore_eos" => s.ignore_eos = value.extract().map_err(|_| bad("a bool"))?,
                _ => {
                    return Err(InvalidInputError::new_err(format!(
                        "unknown keyword argument {key:?} (expected one of {})",
                        KEYWORDS.join(", ")
                    )))
                }
            }
        }
        s.params.validate().map_err(crate::errors::to_py)?;
        Ok(s)
    }

    /// The library's options for `model`.
    pub fn options(&self, model: &Model) -> GenerateOptions {
        GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: self.params,
            eos_ids: if self.ignore_eos {
                Vec::new()
            } else {
                model.eos_ids()
            },
            keep_prompt_logits: false,
        }
    }
}

fn stop_strings(value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if value.is_instance_of::<PyString>() {
        return Ok(vec![value.extract()?]);
    }
    value
        .cast::<PyList>()?
        .iter()
        .map(|v| v.extract())
        .collect()
}

/// Generates from `prompt` in slot 0 and hands each piece of text to
/// `on_text` as soon as it is certain (whole characters, never a part of
/// a stop string); `on_text` returns `false` to stop.
pub fn run(
    model: &mut Model,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampling: &Sampling,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<()> {
    if sampling.max_tokens == 0 {
        return Ok(());
    }
    let opts = sampling.options(model);
    let mut decoder = IncrementalDecoder::new();
    let mut stops = StopMatcher::new(sampling.stop.clone());
    // Generation ended early: a stop string, or `on_text` said stop.
    let mut ended = false;
    let mut on_token = |id: u32| -> Result<bool> {
        if opts.eos_ids.contains(&id) {
            return Ok(true);
        }
        let released = stops.push(&decoder.push(tokenizer, id)?);
        let cancelled = !released.text.is_empty() && !on_text(&released.text);
        ended = cancelled || released.stopped;
        Ok(!ended)
    };
    generate(model, prompt, &opts, &mut on_token)?;
    if !ended {
        let rest = stops.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(())
}

/// Cuts `text` before the first of `stops` it contains.
pub fn cut_at_stop(text: &str, stops: &[String]) -> String {
    let at = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
        .unwrap_or(text.len());
    text[..at].to_string()
}
