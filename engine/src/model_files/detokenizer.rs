//! `IncrementalDetokenizer`: turns a growing list of token ids into text deltas for streaming.
//!
//! A byte-level BPE token can end in the middle of a UTF-8 character; decoding it alone gives
//! U+FFFD. The detokenizer holds such bytes back until the character completes, so a stream of
//! deltas concatenates to exactly the text of the whole sequence and never carries a broken
//! character.

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
        }
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizeError> {
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
