//! Turning generated token ids into text pieces: incremental detokenization
//! that never splits a UTF-8 character, and stop strings that are never
//! released before it is known that they do not match.

use crate::Tokenizer;
use mllm_core::Result;

/// Decodes a growing list of ids piece by piece. Only a short window of
/// recent ids is decoded per token (not the whole list), and text is
/// released only once it decodes to whole characters.
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of the text already released.
    read: usize,
}

impl IncrementalDecoder {
    /// A decoder with no ids yet.
    pub fn new() -> Self {
        IncrementalDecoder {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds `id` and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], true)?;
        let after = tokenizer.decode(&self.ids[self.prefix..], true)?;
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let Some(piece) = after.get(before.len()..) else {
            return Ok(String::new());
        };
        let piece = piece.to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(piece)
    }
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Holds back text that could be the start of a stop string.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::push`] releases.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that is certainly part of the reply.
    pub text: String,
    /// Whether a stop string was found (the text ends before it).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds a piece of text; releases what can no longer be part of a stop
    /// string, or everything before the first stop string found.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_match_len();
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Released {
            text,
            stopped: false,
        }
    }

    /// Everything still held back (the reply ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper
    /// prefix of some stop string (always on a character boundary).
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let longest = stop.len().saturating_sub(1).min(held.len());
            for len in (best + 1..=longest).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(m: &mut StopMatcher, pieces: &[&str]) -> (String, bool) {
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_split_over_pieces_is_never_released() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(
            m.push("hello </"),
            Released {
                text: "hello ".into(),
                stopped: false
            }
        );
        assert_eq!(
            m.push("en"),
            Released {
                text: String::new(),
                stopped: false
            }
        );
        assert_eq!(
            m.push("d> tail"),
            Released {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn false_starts_are_released_once_they_diverge() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(feed(&mut m, &["ST", "OR", "Y"]), ("STORY".into(), false));
        let mut m = StopMatcher::new(vec!["ab".into(), "xyz".into()]);
        assert_eq!(feed(&mut m, &["1x", "y", "a", "b2"]), ("1xy".into(), true));
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_text_is_kept_whole() {
        let mut m = StopMatcher::new(vec!["é!".into(), "b".into()]);
        assert_eq!(feed(&mut m, &["aé", "!b"]), ("a".into(), true));
        let mut m = StopMatcher::new(vec!["ü".into()]);
        assert_eq!(feed(&mut m, &["grün"]), ("gr".into(), true));
        let mut m = StopMatcher::new(vec![String::new()]);
        assert_eq!(feed(&mut m, &["x"]), ("x".into(), false));
    }
}
