//! Reading a Hugging Face `tokenizer.json` without the generic model parse
//! of the `tokenizers` crate, which buffers the whole model section (the
//! vocabulary and the merges) twice over before building the model: for
//! SmolLM2's 1.5 MB file that took 48 MiB of heap at its peak and left 32
//! MiB resident after it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokenizers::models::bpe::{BpeBuilder, Vocab, BPE};
use tokenizers::AddedToken;

/// A BPE model with nothing in it: it stands in for the real one while
/// the other sections are read.
const EMPTY_BPE: &str = r#"{"type":"BPE","vocab":{},"merges":[]}"#;

/// The `type` of a model section.
#[derive(Deserialize)]
struct ModelKind {
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// A BPE model section, read field by field as the crate's own BPE parse
/// reads it, but with each merge read into its final strings (the crate
/// buffers the whole list first to tell its two forms apart).
#[derive(Deserialize)]
struct BpeSection {
    dropout: Option<f32>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    fuse_unk: Option<bool>,
    byte_fallback: Option<bool>,
    ignore_merges: Option<bool>,
    vocab: Vocab,
    /// In rank order (see [`Merge`]).
    merges: Vec<Merge>,
}

impl BpeSection {
    /// The BPE model.
    fn build(self) -> Result<BPE, String> {
        let merges = self.merges.into_iter().filter_map(|m| m.0).collect();
        let b = BPE::builder().vocab_and_merges(self.vocab, merges);
        let b = set(b, self.dropout, BpeBuilder::dropout);
        let b = set(b, self.unk_token, BpeBuilder::unk_token);
        let b = set(
            b,
            self.continuing_subword_prefix,
            BpeBuilder::continuing_subword_prefix,
        );
        let b = set(b, self.end_of_word_suffix, BpeBuilder::end_of_word_suffix);
        let b = set(b, self.fuse_unk, BpeBuilder::fuse_unk);
        let b = set(b, self.byte_fallback, BpeBuilder::byte_fallback);
        let b = set(b, self.ignore_merges, BpeBuilder::ignore_merges);
        b.build().map_err(|e| format!("model: {e}"))
    }
}

/// `option(b, v)` when the section gives `v`, else `b` (the crate's
/// default).
fn set<T>(b: BpeBuilder, v: Option<T>, option: fn(BpeBuilder, T) -> BpeBuilder) -> BpeBuilder {
    match v {
        Some(v) => option(b, v),
        None => b,
    }
}

/// One merge of a BPE model: a pair of strings or, in the older form, one
/// string with the two parts separated by one space (`None` for the
/// `#version` line of that form).
struct Merge(Option<(String, String)>);

impl<'de> Deserialize<'de> for Merge {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MergeVisitor)
    }
}

struct MergeVisitor;

impl<'de> Visitor<'de> for MergeVisitor {
    type Value = Merge;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a merge: two strings, or one string of two parts separated by a space")
    }

    fn visit_str<E: serde::de::Error>(self, line: &str) -> Result<Merge, E> {
        if line.starts_with("#version") {
            return Ok(Merge(None));
        }
        match line.split_once(' ') {
            Some((a, b)) if !b.contains(' ') => Ok(Merge(Some((a.into(), b.into())))),
            _ => Err(E::custom(format!(
                "merge {line:?} is not two parts separated by one space"
            ))),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge, A::Error> {
        let missing = || serde::de::Error::custom("a merge needs two strings");
        let a: String = seq.next_element()?.ok_or_else(missing)?;
        let b: String = seq.next_element()?.ok_or_else(missing)?;
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(serde::de::Error::custom(
                "a merge has more than two strings",
            ));
        }
        Ok(Merge(Some((a, b))))
    }
}

/// Parses a `tokenizer.json`. A BPE model (with a `type`) is read straight
/// from its section (see [`BpeSection`]), the other sections with
/// an empty model in its place, and the added tokens are added last, as
/// the crate's own parse does; any other model takes the generic parse.
pub(crate) fn parse(json: &str) -> Result<tokenizers::Tokenizer, String> {
    let generic = || {
        json.parse::<tokenizers::Tokenizer>()
            .map_err(|e| e.to_string())
    };
    let empty_model = RawValue::from_string(EMPTY_BPE.into()).map_err(|e| e.to_string())?;
    let no_tokens = RawValue::from_string("[]".into()).map_err(|e| e.to_string())?;
    let Ok(mut sections) = serde_json::from_str::<BTreeMap<String, &RawValue>>(json) else {
        return generic();
    };
    let Some(model) = sections.get("model") else {
        return generic();
    };
    let is_bpe = serde_json::from_str::<ModelKind>(model.get())
        .is_ok_and(|m| m.kind.as_deref() == Some("BPE"));
    if !is_bpe {
        return generic();
    }
    let bpe = serde_json::from_str::<BpeSection>(model.get())
        .map_err(|e| format!("model: {e}"))?
        .build()?;
    let added: Vec<AddedToken> = match sections.get("added_tokens") {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|e| format!("added_tokens: {e}"))?,
        None => Vec::new(),
    };
    sections.insert("model".into(), &empty_model);
    sections.insert("added_tokens".into(), &no_tokens);
    let rest = serde_json::to_string(&sections).map_err(|e| e.to_string())?;
    let mut tokenizer = rest
        .parse::<tokenizers::Tokenizer>()
        .map_err(|e| e.to_string())?;
    tokenizer.with_model(bpe);
    tokenizer.add_tokens(added).map_err(|e| e.to_string())?;
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small byte-level BPE tokenizer with every model option set, a
    /// post-processor, and added tokens inside and beyond the vocabulary;
    /// `merges` is spliced in as given.
    fn tokenizer_json(merges: &str) -> String {
        format!(
            r#"{{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {{"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
    {{"id": 9, "content": "<extra>", "single_word": true, "lstrip": true, "rstrip": false, "normalized": true, "special": false}}
  ],
  "normalizer": {{"type": "NFC"}},
  "pre_tokenizer": {{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}},
  "post_processor": {{
    "type": "TemplateProcessing",
    "single": [{{"SpecialToken": {{"id": "<s>", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}],
    "pair": [{{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}],
    "special_tokens": {{"<s>": {{"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}}
  }},
  "decoder": {{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}},
  "model": {{
    "type": "BPE",
    "dropout": null,
    "unk_token": "<unk>",
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": true,
    "byte_fallback": false,
    "ignore_merges": true,
    "vocab": {{"<s>": 0, "<unk>": 1, "a": 2, "b": 3, "Ġ": 4, "ab": 5, "Ġa": 6, "Ġab": 7, "c": 8}},
    "merges": {merges}
  }}
}}"#
        )
    }

    fn generic(json: &str) -> tokenizers::Tokenizer {
        json.parse().unwrap()
    }

    /// The same tokenizer as the crate's parse: its serialized form (the
    /// vocabulary, merges, options and added tokens with their ids) and
    /// its encodings.
    fn assert_same(json: &str) {
        let (lean, want) = (parse(json).unwrap(), generic(json));
        assert_eq!(
            lean.to_string(false).unwrap(),
            want.to_string(false).unwrap()
        );
        for text in ["ab ab a", "ab<extra>cab", "<s>b a", "zz ab"] {
            for special in [false, true] {
                let got = lean.encode(text, special).unwrap();
                let want = want.encode(text, special).unwrap();
                assert_eq!(got.get_ids(), want.get_ids(), "{text:?}");
                assert_eq!(got.get_tokens(), want.get_tokens(), "{text:?}");
            }
        }
    }

    #[test]
    fn a_bpe_tokenizer_equals_the_crates_parse_in_both_merge_forms() {
        assert_same(&tokenizer_json(r#"[["a", "b"], ["Ġ", "a"], ["Ġa", "b"]]"#));
        assert_same(&tokenizer_json(
            r##"["#version: 0.2", "a b", "Ġ a", "Ġa b"]"##,
        ));
        let lean = parse(&tokenizer_json(r#"[["a", "b"]]"#)).unwrap();
        assert_eq!(lean.token_to_id("<extra>"), Some(9));
        assert_eq!(lean.encode("ab", true).unwrap().get_ids(), [0, 5]);
    }

    #[test]
    fn other_models_take_the_crates_parse() {
        let json = r#"{"version": "1.0", "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hi": 1}, "unk_token": "[UNK]"}}"#;
        assert_same_wordlevel(json);
    }

    fn assert_same_wordlevel(json: &str) {
        let (lean, want) = (parse(json).unwrap(), generic(json));
        assert_eq!(
            lean.to_string(false).unwrap(),
            want.to_string(false).unwrap()
        );
        assert_eq!(lean.encode("hi there", false).unwrap().get_ids(), [1, 0]);
    }

    #[test]
    fn malformed_merges_are_errors() {
        for (merges, want) in [
            (
                r#"["a b c"]"#,
                "merge \"a b c\" is not two parts separated by one space",
            ),
            (
                r#"["ab"]"#,
                "merge \"ab\" is not two parts separated by one space",
            ),
            (r#"[["a"]]"#, "a merge needs two strings"),
            (r#"[["a", "b", "c"]]"#, "a merge has more than two strings"),
            (r#"[3]"#, "a merge: two strings"),
            (r#"[["a", "zz"]]"#, "model: "),
        ] {
            let err = parse(&tokenizer_json(merges)).unwrap_err();
            assert!(err.contains(want), "{merges}: {err}");
        }
    }

    #[test]
    fn invalid_json_fails_as_in_the_crates_parse() {
        for json in ["", "{", "[1, 2]", r#"{"model": 3}"#] {
            let want = json
                .parse::<tokenizers::Tokenizer>()
                .unwrap_err()
                .to_string();
            assert_eq!(parse(json).unwrap_err(), want, "{json:?}");
        }
    }
}
