//! Rebuilding a Hugging Face `tokenizer.json` from GGUF tokenizer metadata.
//!
//! Supported `tokenizer.ggml.model`s:
//! - `gpt2`: byte-level BPE, with the pre-tokenizer families named by
//!   `tokenizer.ggml.pre` in [`pre_tokenizer`]. The token strings and merges
//!   are byte-level encoded in the file already, so they become the BPE
//!   vocabulary and merges as they are.
//! - `llama`: SentencePiece BPE (Llama 1/2, Gemma, Mistral's first
//!   vocabularies), see `super::spm`.

use mllm_core::{Error, Result};
use mllm_models::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::reader::GgufFile;
use super::spm;

/// GGUF token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    /// Not set (treated as normal).
    pub const UNDEFINED: i64 = 0;
    /// A regular vocabulary entry.
    pub const NORMAL: i64 = 1;
    /// The unknown token.
    pub const UNKNOWN: i64 = 2;
    /// A control token (`<|im_start|>`): an added special token.
    pub const CONTROL: i64 = 3;
    /// A user-defined token: an added, non-special token.
    pub const USER_DEFINED: i64 = 4;
    /// An unused slot.
    pub const UNUSED: i64 = 5;
    /// A byte token (`<0x0A>`).
    pub const BYTE: i64 = 6;
}

/// The special token ids named in the tokenizer metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
}

impl SpecialIds {
    /// Reads the ids (each optional; present ones must fit in u32).
    pub fn read(gguf: &GgufFile) -> Result<Self> {
        let get = |what: &str| -> Result<Option<u32>> {
            let key = format!("tokenizer.ggml.{what}_token_id");
            gguf.opt_u64(&key)?
                .map(|v| {
                    u32::try_from(v)
                        .map_err(|_| Error::BadGguf(format!("metadata '{key}' = {v} is too large")))
                })
                .transpose()
        };
        Ok(SpecialIds {
            bos: get("bos")?,
            eos: get("eos")?,
            unk: get("unknown")?,
            pad: get("padding")?,
        })
    }
}

/// How a byte-level BPE family splits text before the merges.
#[derive(Clone, Debug, PartialEq)]
pub struct PreTokenizer {
    /// The `pre_tokenizer` entry.
    pub pre_tokenizer: Value,
    /// The `normalizer` entry (`null` for none).
    pub normalizer: Value,
    /// Whether whole words found in the vocabulary skip the merges (Llama
    /// 3's tokenizer does that).
    pub ignore_merges: bool,
}

/// The pre-tokenizer (and normalizer) of a `tokenizer.ggml.pre` family.
///
/// - `smollm`, `starcoder`, `refact`: every digit on its own, then the GPT-2
///   byte-level split (the configuration of these models' Hugging Face
///   tokenizers);
/// - `gpt2`: the GPT-2 byte-level split;
/// - `llama-bpe`, `llama3`: the Llama 3 split pattern (numbers in groups of
///   up to three), then byte-level mapping without a second split; whole
///   words in the vocabulary skip the merges;
/// - `qwen2`: Qwen2's pattern (the Llama 3 one with single digits) after
///   NFC normalization, then byte-level mapping.
pub fn pre_tokenizer(pre: &str) -> Result<PreTokenizer> {
    let split = |pattern: &str| {
        json!({
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": { "Regex": pattern },
                    "behavior": "Isolated",
                    "invert": false
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": false,
                    "trim_offsets": true,
                    "use_regex": false
                }
            ]
        })
    };
    let byte_level = |use_regex: bool| {
        json!({
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": true,
            "use_regex": use_regex
        })
    };
    let plain = |pre_tokenizer: Value| PreTokenizer {
        pre_tokenizer,
        normalizer: Value::Null,
        ignore_merges: false,
    };
    Ok(match pre {
        "smollm" | "starcoder" | "refact" => plain(json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Digits", "individual_digits": true },
                byte_level(true)
            ]
        })),
        "gpt2" => plain(byte_level(true)),
        "llama-bpe" | "llama3" => PreTokenizer {
            ignore_merges: true,
            ..plain(split(LLAMA3_SPLIT))
        },
        "qwen2" => PreTokenizer {
            normalizer: json!({ "type": "NFC" }),
            ..plain(split(QWEN2_SPLIT))
        },
        other => {
            return Err(Error::Tokenizer(format!(
                "GGUF pre-tokenizer '{other}' is not supported (known: smollm, starcoder, refact, gpt2, llama-bpe, qwen2)"
            )))
        }
    })
}

/// Llama 3's pre-tokenization pattern.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenization pattern: Llama 3's with digits one by one.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.json` text of the file's tokenizer, or `None` when the file
/// has no `tokenizer.ggml.model`.
///
/// Control tokens (type 3) and the unknown token (type 2) become added
/// special tokens, user-defined tokens (type 4) added non-special tokens;
/// when the file has no token types, the bos/eos/unk/pad tokens are the
/// special ones. `tokenizer.ggml.add_bos_token` / `add_eos_token` (by
/// default: bos for SentencePiece, neither for BPE, as llama.cpp does)
/// become a post-processor that adds them. The result is loaded once with
/// the `tokenizers` crate to check it, and the vocabulary size must equal
/// the token count.
pub fn tokenizer_json(gguf: &GgufFile) -> Result<Option<String>> {
    let Some(model) = gguf.opt_str("tokenizer.ggml.model")? else {
        return Ok(None);
    };
    let sentencepiece = match model {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model '{other}' is not supported yet (supported: 'gpt2', \
                 byte-level BPE, and 'llama', SentencePiece)"
            )))
        }
    };
    let vocab = Vocabulary::read(gguf)?;
    let (normalizer, pre_tokenizer, decoder, model) = if sentencepiece {
        spm::parts(gguf, &vocab)?
    } else {
        bpe_parts(gguf, &vocab)?
    };
    let add_bos = gguf
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(sentencepiece);
    let add_eos = gguf
        .opt_bool("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);
    let bos = add_bos
        .then(|| special_token(vocab.tokens, vocab.ids.bos, "bos"))
        .transpose()?;
    let eos = add_eos
        .then(|| special_token(vocab.tokens, vocab.ids.eos, "eos"))
        .transpose()?;

    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": vocab.added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(bos, eos),
        "decoder": decoder,
        "model": model
    });
    let text = serde_json::to_string(&json)
        .map_err(|e| Error::Tokenizer(format!("cannot serialize tokenizer.json: {e}")))?;
    let loaded = Tokenizer::from_json(&text)?;
    let size = loaded.inner().get_vocab_size(true);
    if size != vocab.tokens.len() {
        return Err(Error::Tokenizer(format!(
            "the rebuilt tokenizer has {size} tokens, the GGUF lists {}",
            vocab.tokens.len()
        )));
    }
    Ok(Some(text))
}

/// The token list of a GGUF vocabulary with what both models need from it.
pub(super) struct Vocabulary<'a> {
    /// `tokenizer.ggml.tokens`.
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type`, when present (one per token).
    pub types: Option<Vec<i64>>,
    /// The special token ids.
    pub ids: SpecialIds,
    /// Token text to id (checked to be unique).
    pub map: Map<String, Value>,
    /// The `added_tokens` entries.
    pub added: Vec<Value>,
}

impl<'a> Vocabulary<'a> {
    fn read(gguf: &'a GgufFile) -> Result<Self> {
        let tokens = gguf.opt_strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
            Error::BadGguf("metadata key 'tokenizer.ggml.tokens' is missing".into())
        })?;
        if tokens.is_empty() {
            return Err(Error::BadGguf("tokenizer.ggml.tokens is empty".into()));
        }
        let types = gguf.opt_ints("tokenizer.ggml.token_type")?;
        if let Some(t) = &types {
            if t.len() != tokens.len() {
                return Err(Error::BadGguf(format!(
                    "tokenizer.ggml.token_type has {} entries for {} tokens",
                    t.len(),
                    tokens.len()
                )));
            }
        }
        let ids = SpecialIds::read(gguf)?;
        let special_ids = [ids.bos, ids.eos, ids.unk, ids.pad];
        for id in special_ids.into_iter().flatten() {
            if id as usize >= tokens.len() {
                return Err(Error::BadGguf(format!(
                    "special token id {id} is outside the vocabulary of {} tokens",
                    tokens.len()
                )));
            }
        }
        let mut map = Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, token) in tokens.iter().enumerate() {
            if let Some(Value::Number(first)) = map.insert(token.clone(), json!(id)) {
                return Err(Error::Tokenizer(format!(
                    "token {token:?} appears twice in tokenizer.ggml.tokens (ids {first} and {id})"
                )));
            }
            let special = match &types {
                Some(t) => match t[id] {
                    token_type::CONTROL | token_type::UNKNOWN => Some(true),
                    token_type::USER_DEFINED => Some(false),
                    token_type::UNDEFINED
                    | token_type::NORMAL
                    | token_type::UNUSED
                    | token_type::BYTE => None,
                    other => {
                        return Err(Error::BadGguf(format!(
                            "token {id} ({token:?}) has unknown token type {other}"
                        )))
                    }
                },
                None => special_ids.contains(&Some(id as u32)).then_some(true),
            };
            if let Some(special) = special {
                added.push(json!({
                    "id": id,
                    "content": token,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": special
                }));
            }
        }
        Ok(Vocabulary {
            tokens,
            types,
            ids,
            map,
            added,
        })
    }

    /// The type of token `id` (normal when the file has no types).
    pub fn type_of(&self, id: usize) -> i64 {
        self.types.as_ref().map_or(token_type::NORMAL, |t| t[id])
    }
}

/// `(normalizer, pre_tokenizer, decoder, model)` of a byte-level BPE
/// vocabulary.
fn bpe_parts(gguf: &GgufFile, vocab: &Vocabulary<'_>) -> Result<(Value, Value, Value, Value)> {
    let pre = gguf.opt_str("tokenizer.ggml.pre")?.ok_or_else(|| {
        Error::Tokenizer(
            "the GGUF names no pre-tokenizer (tokenizer.ggml.pre), so its splitting rules are unknown"
                .into(),
        )
    })?;
    let pre = pre_tokenizer(pre)?;
    let merges = gguf.opt_strings("tokenizer.ggml.merges")?.unwrap_or(&[]);
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split(' ').collect::<Vec<_>>()[..] {
            [a, b] if !a.is_empty() && !b.is_empty() => Ok(json!([a, b])),
            _ => Err(Error::BadGguf(format!(
                "merge {i} ({m:?}) is not two tokens separated by one space"
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    let decoder = json!({
        "type": "ByteLevel",
        "add_prefix_space": true,
        "trim_offsets": true,
        "use_regex": true
    });
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        "ignore_merges": pre.ignore_merges,
        "vocab": vocab.map,
        "merges": merges
    });
    Ok((pre.normalizer, pre.pre_tokenizer, decoder, model))
}

/// `(id, text)` of a special token that the post-processor adds.
fn special_token(tokens: &[String], id: Option<u32>, what: &str) -> Result<(u32, String)> {
    let id = id.ok_or_else(|| {
        Error::BadGguf(format!(
            "tokenizer.ggml.add_{what}_token is set but tokenizer.ggml.{what}_token_id is missing"
        ))
    })?;
    Ok((id, tokens[id as usize].clone()))
}

/// A template post-processor adding the optional bos/eos around each sequence.
fn post_processor(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Value {
    let special = |t: &(u32, String), type_id: u32| json!({ "SpecialToken": { "id": t.1, "type_id": type_id } });
    let sequence = |id: &str, type_id: u32| json!({ "Sequence": { "id": id, "type_id": type_id } });
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (seq, type_id) in [("A", 0), ("B", 1)] {
        let mut part = Vec::new();
        part.extend(bos.iter().map(|t| special(t, type_id)));
        part.push(sequence(seq, type_id));
        part.extend(eos.iter().map(|t| special(t, type_id)));
        if seq == "A" {
            single = part.clone();
        }
        pair.extend(part);
    }
    let mut specials = Map::new();
    for (id, text) in bos.iter().chain(eos.iter()) {
        specials.insert(
            text.clone(),
            json!({ "id": text, "ids": [id], "tokens": [text] }),
        );
    }
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials
    })
}
