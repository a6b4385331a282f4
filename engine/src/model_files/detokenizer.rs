//! `IncrementalDetokenizer`: turns a growing list of token ids into text deltas for streaming.
//!
//! A byte-level BPE token can end in the middle of a UTF-8 character; decoding it alone gives
//! U+FFFD. The detokenizer holds such bytes back until the character completes, so a stream of
//! deltas concatenates to exactly the text of the whole sequence and never carries a broken
//! character.
//!
//! Where the tokenizer's [`Pieces`](crate::model_files::tokenizer::Pieces) table holds (its
//! decoding is the concatenation of token bytes), a token after the prompt appends its bytes and
//! the complete characters are emitted: a table lookup instead of decoding a window of tokens
//! twice per token, the largest share of a decode step's host work at hundreds of sequences.
//! Otherwise (no table, special tokens kept, no prompt before the first token) the window is
//! decoded as before.

use crate::model_files::tokenizer::{TokenizeError, Tokenizer};

/// Tokens kept before the read point so that merges with the previous token decode right.
const CONTEXT_TOKENS: usize = 6;

/// Streaming decoder state for one sequence.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    /// Start of the window that is re-decoded for context.
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
    skip_special: bool,
    /// Whether tokens go through the byte table (decided at the first token).
    fast: Option<bool>,
    /// The byte table's path: bytes of a character not yet complete.
    pending: Vec<u8>,
}

impl IncrementalDetokenizer {
    /// Starts a stream after `prompt_ids` (which are never emitted).
    pub fn new(prompt_ids: &[u32], skip_special: bool) -> Self {
        let start = prompt_ids.len().saturating_sub(CONTEXT_TOKENS);
        IncrementalDetokenizer {
            ids: prompt_ids[start..].to_vec(),
            prefix_offset: 0,
            read_offset: prompt_ids.len() - start,
            skip_special,
            fast: None,
            pending: Vec::new(),
        }
    }

    /// Like [`IncrementalDetokenizer::new`], always decoding windows of tokens (the byte
    /// table's reference).
    pub fn windowed(prompt_ids: &[u32], skip_special: bool) -> Self {
        IncrementalDetokenizer {
            fast: Some(false),
            ..IncrementalDetokenizer::new(prompt_ids, skip_special)
        }
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizeError> {
        // The table stands for text after other text, and only with special tokens skipped.
        let fast = *self.fast.get_or_insert_with(|| {
            self.skip_special && self.read_offset > 0 && tok.pieces().is_some()
        });
        if let (true, Some(pieces)) = (fast, tok.pieces()) {
            self.pending.extend_from_slice(pieces.get(id));
            return Ok(take_complete(&mut self.pending));
        }
        self.ids.push(id);
        let prefix =
            tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.get(prefix.len()..).filter(|_| full.starts_with(&prefix)) {
                let delta = delta.to_string();
                self.advance();
                return Ok(delta);
            }
            // The context window decoded differently once extended (rare): emit the difference
            // from the last complete character boundary conservatively.
            let delta = full.chars().skip(prefix.chars().count()).collect::<String>();
            self.advance();
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// Text still held back (an incomplete character at the end of the stream), flushed as-is.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, TokenizeError> {
        if self.fast == Some(true) {
            let tail = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            return Ok(tail);
        }
        let prefix =
            tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.advance();
        Ok(full.get(prefix.len()..).unwrap_or("").to_string())
    }

    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Keep the buffer bounded for long generations.
        if self.prefix_offset > 4 * CONTEXT_TOKENS {
            let keep_from = self.prefix_offset;
            self.ids.drain(..keep_from);
            self.read_offset -= keep_from;
            self.prefix_offset = 0;
        }
    }
}

/// Takes the complete characters off the front of `buf`, leaving an incomplete one at its end
/// for later bytes; an invalid byte sequence becomes U+FFFD, as in lossy decoding.
fn take_complete(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(buf) {
            Ok(s) => {
                out.push_str(s);
                buf.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&buf[..valid]).expect("valid up to here"));
                match e.error_len() {
                    None => {
                        buf.drain(..valid);
                        return out;
                    }
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        buf.drain(..valid + bad);
                    }
                }
            }
        }
    }
}
