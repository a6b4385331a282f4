//! Turning a request's text into prompt token ids, within the admission bounds.
//!
//! - A text longer than the prompt limit times [`Tokenizer::max_bytes_per_token`] cannot fit
//!   in the limit, so it is refused before it is tokenized: no request can spend more router
//!   time or memory on tokenizing than its limit implies.
//! - Special-token text in chat messages (`<|im_end|>` typed by a user) is read as plain text
//!   by default ([`SpecialTokens::Plain`]), so a message cannot close its turn and open one
//!   under another role. Only the chat template's own special tokens are control tokens.

use tandem_engine::model_files::tokenizer::{TokenizeError, Tokenizer};
use tandem_engine::{ChatMessage, ChatTemplate};

use crate::error::ApiError;

/// How special-token text inside chat messages is tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecialTokens {
    /// As the characters it is made of (the default: a message cannot forge template markup).
    #[default]
    Plain,
    /// As control tokens (what the template's own markup is; lets a client write raw turns).
    Control,
}

impl std::str::FromStr for SpecialTokens {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(SpecialTokens::Plain),
            "control" => Ok(SpecialTokens::Control),
            other => Err(format!("'{other}' is not a special-token mode (plain or control)")),
        }
    }
}

/// Marks the start and the end of a placeholder in rendered chat text (Unicode private use).
const OPEN: char = '\u{E000}';
const CLOSE: char = '\u{E001}';

/// Refuses a text that cannot fit in `limit` tokens, by its length alone.
pub fn check_text_len(
    tok: &Tokenizer,
    text: &str,
    limit: usize,
    param: &str,
) -> Result<(), ApiError> {
    too_long(tok, text.len(), limit, param)
}

fn too_long(tok: &Tokenizer, bytes: usize, limit: usize, param: &str) -> Result<(), ApiError> {
    let most = limit.saturating_mul(tok.max_bytes_per_token());
    if bytes > most {
        return Err(ApiError::invalid(Some(param), format!("the prompt is {bytes} bytes long and cannot fit in the {limit} prompt tokens this server accepts (the maximum context length less one, or --max-prompt-tokens)")));
    }
    Ok(())
}

/// Encodes a completion prompt (special-token text in it is markup: the client wrote the whole
/// prompt), after the length check.
pub fn encode_text(tok: &Tokenizer, text: &str, limit: usize) -> Result<Vec<u32>, ApiError> {
    check_text_len(tok, text, limit, "prompt")?;
    tok.encode(text, true).map_err(|e| {
        ApiError::invalid(Some("prompt"), format!("the prompt cannot be tokenized: {e}"))
    })
}

/// Renders the conversation with the chat template and encodes it, after the length check.
/// With [`SpecialTokens::Plain`], special-token text inside the messages becomes plain text.
pub fn encode_chat(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
    mode: SpecialTokens,
    limit: usize,
) -> Result<Vec<u32>, ApiError> {
    encode_chat_with(tok, template, messages, None, mode, limit, true)
}

/// [`encode_chat`], with the template's `tools` variable, and with or without the assistant
/// turn's opening (`add_generation_prompt`).
pub fn encode_chat_with(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    mode: SpecialTokens,
    limit: usize,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    too_long(tok, messages.iter().map(|m| m.content.len()).sum(), limit, "messages")?;
    let render = |ms: &[ChatMessage]| {
        template
            .render_with_tools(ms, tools, add_generation_prompt)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))
    };
    let encode_err = |e: TokenizeError| {
        ApiError::invalid(Some("messages"), format!("the messages cannot be tokenized: {e}"))
    };
    // The special texts to neutralise: every special token, and the placeholder mark itself (so
    // a message cannot forge a placeholder).
    let mut escapes: Vec<String> = match mode {
        SpecialTokens::Control => Vec::new(),
        SpecialTokens::Plain => tok
            .special_texts()
            .into_iter()
            .filter(|s| messages.iter().any(|m| m.content.contains(s.as_str())))
            .collect(),
    };
    if escapes.is_empty() {
        let text = render(messages)?;
        check_text_len(tok, &text, limit, "messages")?;
        return tok.encode(&text, true).map_err(encode_err);
    }
    escapes.push(OPEN.to_string());
    // Longest first, so a special text that contains another is replaced whole.
    escapes.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let escaped: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage { content: escape(&m.content, &escapes), ..m.clone() })
        .collect();
    let text = render(&escaped)?;
    check_text_len(tok, &text, limit, "messages")?;
    // Template text (its markup is control tokens) alternates with placeholders (plain text).
    let mut ids = Vec::new();
    let mut rest = text.as_str();
    let mut first = true;
    while !rest.is_empty() {
        let (head, tail) = match rest.find(OPEN) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if !head.is_empty() || first {
            ids.extend(tok.encode(head, first).map_err(encode_err)?);
            first = false;
        }
        if tail.is_empty() {
            break;
        }
        let end = tail.find(CLOSE).ok_or_else(|| {
            ApiError::invalid(
                Some("messages"),
                "the chat template split a message's special-token text",
            )
        })?;
        let k: usize = tail[OPEN.len_utf8()..end].parse().map_err(|_| {
            ApiError::invalid(
                Some("messages"),
                "the chat template altered a message's special-token text",
            )
        })?;
        let original = escapes.get(k).ok_or_else(|| {
            ApiError::invalid(
                Some("messages"),
                "the chat template altered a message's special-token text",
            )
        })?;
        ids.extend(tok.encode_plain(original).map_err(encode_err)?);
        rest = &tail[end + CLOSE.len_utf8()..];
    }
    Ok(ids)
}

/// `text` with each occurrence of `escapes[k]` replaced by the placeholder `OPEN k CLOSE`.
fn escape(text: &str, escapes: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'outer: while i < text.len() {
        for (k, e) in escapes.iter().enumerate() {
            if text[i..].starts_with(e.as_str()) {
                out.push(OPEN);
                out.push_str(&k.to_string());
                out.push(CLOSE);
                i += e.len();
                continue 'outer;
            }
        }
        let c = text[i..].chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_replaces_whole_special_texts_longest_first() {
        let escapes = vec!["<|im_start|>".to_string(), "<|im".to_string(), OPEN.to_string()];
        assert_eq!(
            escape("a<|im_start|>b<|imc\u{E000}", &escapes),
            format!("a{OPEN}0{CLOSE}b{OPEN}1{CLOSE}c{OPEN}2{CLOSE}")
        );
        assert_eq!(escape("plain é text", &escapes), "plain é text");
    }

    #[test]
    fn modes_parse() {
        assert_eq!("plain".parse::<SpecialTokens>(), Ok(SpecialTokens::Plain));
        assert_eq!("control".parse::<SpecialTokens>(), Ok(SpecialTokens::Control));
        assert!("raw".parse::<SpecialTokens>().is_err());
    }
}
