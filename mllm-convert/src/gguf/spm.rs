//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`) as a
//! Hugging Face BPE tokenizer.
//!
//! llama.cpp tokenizes these by repeatedly merging the adjacent pair whose
//! concatenation is the best-scored vocabulary piece; characters no piece
//! covers fall back to byte tokens (`<0x41>`). The same result comes from a
//! BPE model whose merges are every split of every piece into two pieces,
//! ranked by the score of the merged piece (what Hugging Face's converter
//! builds from a SentencePiece model), with byte fallback. Spaces become
//! `▁` (U+2581), with one prepended to the text when
//! `tokenizer.ggml.add_space_prefix` is set (the default); decoding turns
//! them back and drops that first space.

use std::collections::HashMap;

use mllm_core::{Error, Result};
use serde_json::{json, Value};

use super::reader::GgufFile;
use super::tokenizer::{token_type, Vocabulary};

/// The word-boundary marker that stands for a space.
const SPACE: &str = "\u{2581}";

/// `(normalizer, pre_tokenizer, decoder, model)` of a SentencePiece
/// vocabulary.
pub(super) fn parts(
    gguf: &GgufFile,
    vocab: &Vocabulary<'_>,
) -> Result<(Value, Value, Value, Value)> {
    let scores = gguf.opt_f32s("tokenizer.ggml.scores")?.ok_or_else(|| {
        Error::BadGguf(
            "a SentencePiece vocabulary needs tokenizer.ggml.scores, which is missing".into(),
        )
    })?;
    if scores.len() != vocab.tokens.len() {
        return Err(Error::BadGguf(format!(
            "tokenizer.ggml.scores has {} entries for {} tokens",
            scores.len(),
            vocab.tokens.len()
        )));
    }
    let space_prefix = gguf
        .opt_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let replace = json!({
        "type": "Replace",
        "pattern": { "String": " " },
        "content": SPACE
    });
    let normalizer = if space_prefix {
        json!({
            "type": "Sequence",
            "normalizers": [{ "type": "Prepend", "prepend": SPACE }, replace]
        })
    } else {
        replace
    };
    let mut decoders = vec![
        json!({ "type": "Replace", "pattern": { "String": SPACE }, "content": " " }),
        json!({ "type": "ByteFallback" }),
        json!({ "type": "Fuse" }),
    ];
    if space_prefix {
        decoders.push(json!({ "type": "Strip", "content": " ", "start": 1, "stop": 0 }));
    }
    let unk = vocab
        .ids
        .unk
        .map_or(Value::Null, |id| json!(vocab.tokens[id as usize]));
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": unk,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": true,
        "byte_fallback": true,
        "ignore_merges": false,
        "vocab": vocab.map,
        "merges": merges(vocab, scores)
    });
    let decoder = json!({ "type": "Sequence", "decoders": decoders });
    Ok((normalizer, Value::Null, decoder, model))
}

/// Every split of every mergeable piece into two pieces, best merged score
/// first; ties keep the order of the merged pieces' ids, and the splits of
/// one piece are ordered by the ids of their left, then right, halves.
/// Control, unknown, byte and unused tokens are never the result of a
/// merge.
fn merges(vocab: &Vocabulary<'_>, scores: &[f32]) -> Vec<Value> {
    let mergeable = |id: usize| {
        !matches!(
            vocab.type_of(id),
            token_type::CONTROL | token_type::UNKNOWN | token_type::BYTE | token_type::UNUSED
        )
    };
    let ids: HashMap<&str, usize> = vocab
        .tokens
        .iter()
        .enumerate()
        .filter(|&(id, _)| mergeable(id))
        .map(|(id, t)| (t.as_str(), id))
        .collect();
    let mut found: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !mergeable(id) {
            continue;
        }
        let start = found.len();
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                found.push((scores[id], id, l, r));
            }
        }
        found[start..].sort_by_key(|&(_, _, l, r)| (l, r));
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0));
    found
        .into_iter()
        .map(|(_, _, l, r)| json!([vocab.tokens[l], vocab.tokens[r]]))
        .collect()
}
