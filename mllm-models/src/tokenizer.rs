//! Tokenization with the Hugging Face `tokenizers` crate, from the
//! `tokenizer.json` embedded in a `.mllm` file.

use mllm_core::{Error, Result};

/// A text tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Parses a Hugging Face `tokenizer.json`. A BPE model is read with a
    /// third of the `tokenizers` crate's transient heap (see
    /// `tokenizer_json`); the result is the same tokenizer.
    pub fn from_json(json: &str) -> Result<Self> {
        let inner = crate::tokenizer_json::parse(json)
            .map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer.json: {e}")))?;
        Ok(Tokenizer { inner })
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS token), as `tokenizer(text)` does in Python.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("cannot encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, optionally without special tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("cannot decode: {e}")))
    }

    /// The string of a token id, when it is in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token string, when it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Turns a stream of token ids into text pieces that never split a
/// multi-byte UTF-8 character: text is released only once it decodes cleanly.
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    printed: usize,
}

impl<'t> TextStream<'t> {
    /// A stream starting with no tokens.
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        TextStream {
            tokenizer,
            ids: Vec::new(),
            printed: 0,
        }
    }

    /// Adds a token and returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, true)?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.printed
            || !text.is_char_boundary(self.printed)
        {
            return Ok(String::new());
        }
        let piece = text[self.printed..].to_string();
        self.printed = text.len();
        Ok(piece)
    }
}
