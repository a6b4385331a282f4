//! The OpenAI request bodies the gateway accepts (with vLLM's extra sampling fields) and their
//! validation into token ids and the engine's [`SamplingParams`].
//!
//! Numbers are parsed wide (signed integers, f64) so an out-of-range value gets a message that
//! names the parameter and its range instead of a bare type error. A field no struct here reads
//! is refused with a 400 naming it ([`parse_body`]); docs/serving.md lists every field.

use serde::Deserialize;
use tandem_engine::sampling::sampling_params::MAX_LOGPROBS;
use tandem_engine::{ChatMessage, SamplingParams};

use crate::error::ApiError;
use crate::structured::{ResponseFormat, StructuredFields, StructuredOutputsParams};
use crate::tools::{ToolCallIn, ToolChoiceIn, ToolIn};

/// `prompt`: a string, a list of strings, a list of token ids, or a list of those.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// One tokenized prompt.
    Tokens(Vec<i64>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several tokenized prompts.
    TokenLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling fields shared by both endpoints (OpenAI's and vLLM's extras).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    /// Model name.
    pub model: Option<String>,
    /// Completion token limit.
    pub max_tokens: Option<i64>,
    /// Temperature, 0..=2.
    pub temperature: Option<f64>,
    /// Nucleus mass, (0, 1].
    pub top_p: Option<f64>,
    /// Completions per prompt.
    pub n: Option<i64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Presence penalty, -2..=2.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty, -2..=2.
    pub frequency_penalty: Option<f64>,
    /// Seed of the request's random stream.
    pub seed: Option<i64>,
    /// Token biases: token id (as a string) → value added to its logit, -100..=100.
    pub logit_bias: Option<std::collections::HashMap<String, f64>>,
    /// vLLM: top-k filter.
    pub top_k: Option<i64>,
    /// vLLM: min-p filter.
    pub min_p: Option<f64>,
    /// vLLM: repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// vLLM: minimum completion tokens.
    pub min_tokens: Option<i64>,
    /// vLLM: stop token ids.
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: keep going past end-of-sequence.
    pub ignore_eos: Option<bool>,
    /// vLLM: leave special tokens out of the text.
    pub skip_special_tokens: Option<bool>,
    /// vLLM: keep the matched stop string in the text.
    pub include_stop_str_in_output: Option<bool>,
    /// Prefix-cache isolation salt.
    pub cache_salt: Option<String>,
    /// Scheduling priority (lower first).
    pub priority: Option<i32>,
    /// `false` opts the request out of speculative decoding.
    pub speculative: Option<bool>,
    /// OpenAI: `text`, `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
    pub structured_outputs: Option<StructuredOutputsParams>,
    /// vLLM (older): a JSON schema.
    pub guided_json: Option<serde_json::Value>,
    /// vLLM (older): a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM (older): a list of strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (older): a Lark grammar.
    pub guided_grammar: Option<String>,
    /// llama-server: a GBNF (or Lark) grammar.
    pub grammar: Option<String>,
    /// llama-server: a JSON schema.
    pub json_schema: Option<serde_json::Value>,
    /// vLLM: the log-probability of each prompt token, with this many alternatives.
    pub prompt_logprobs: Option<i64>,
    /// vLLM: beam search of width `n`.
    pub use_beam_search: Option<bool>,
    /// vLLM: beam scores are divided by length to this power (default 1).
    pub length_penalty: Option<f64>,
}

impl CommonParams {
    /// The structured-output fields, read by [`StructuredFields::constraint`].
    pub fn structured_fields(&self) -> StructuredFields {
        StructuredFields {
            response_format: self.response_format.clone(),
            structured_outputs: self.structured_outputs.clone(),
            guided_json: self.guided_json.clone(),
            guided_regex: self.guided_regex.clone(),
            guided_choice: self.guided_choice.clone(),
            guided_grammar: self.guided_grammar.clone(),
            grammar: self.grammar.clone(),
            json_schema: self.json_schema.clone(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Option<PromptInput>,
    /// Log-probabilities of this many alternatives per token (0..=20).
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the completion.
    pub echo: Option<bool>,
    /// Must equal `n` when given.
    pub best_of: Option<i64>,
    /// Not supported.
    pub suffix: Option<String>,
}

/// Message content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The content.
    pub content: Option<Content>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Option<Vec<Message>>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Return log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token with `logprobs` (0..=20).
    pub top_logprobs: Option<i64>,
    /// Functions the model may call.
    pub tools: Option<Vec<ToolIn>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<ToolChoiceIn>,
    /// Several calls in one turn (default true).
    pub parallel_tool_calls: Option<bool>,
}

/// Parses a JSON body into the endpoint's own fields and the shared sampling fields, naming the
/// offending field in any error.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<(T, CommonParams), ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(None, "the request body is empty; expected a JSON object"));
    }
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    }
    let ((own, by_own), (common, by_common)) = (typed::<T>(&v)?, typed::<CommonParams>(&v)?);
    refuse_unknown(&v, &by_own, &by_common)?;
    Ok((own, common))
}

/// Refuses a field that neither the endpoint's struct nor [`CommonParams`] reads (at any depth:
/// a message's `tool_calls`' extra keys, llama-server's `n_probs`, …) with a 400
/// naming it, rather than ignoring it; `by_own` and `by_common` are the paths each left unread.
/// A field set to `null` counts as absent.
fn refuse_unknown(
    v: &serde_json::Value,
    by_own: &[String],
    by_common: &[String],
) -> Result<(), ApiError> {
    let top = |p: &str| p.split(['.', '[']).next().unwrap_or("").to_string();
    let nested = |p: &str| p.contains(['.', '[']);
    let is_null = |path: &str| {
        let pointer = path.replace('[', ".").replace(']', "").replace('.', "/");
        v.pointer(&format!("/{pointer}")).is_some_and(serde_json::Value::is_null)
    };
    // A top-level key one struct reads is ignored by the other: only the reader's verdict on
    // what lies inside it counts.
    let unknown = by_own
        .iter()
        .filter(|p| if nested(p) { !by_own.contains(&top(p)) } else { by_common.contains(*p) })
        .chain(by_common.iter().filter(|p| nested(p) && !by_common.contains(&top(p))))
        .find(|p| !is_null(p))
        .cloned()
        .or_else(|| unknown_content_part_key(v));
    match unknown {
        Some(p) => Err(ApiError::invalid(
            Some(&p),
            format!(
                "unsupported field '{p}': this server does not honour it (see docs/serving.md)"
            ),
        )),
        None => Ok(()),
    }
}

/// A key of a message's content part other than `type` and the part's own payload key (`text`
/// for a text part; other kinds are refused by [`chat_messages`]): [`Content`] is an untagged
/// enum, whose insides `serde_ignored` cannot see.
fn unknown_content_part_key(v: &serde_json::Value) -> Option<String> {
    let messages = v.get("messages")?.as_array()?;
    for (i, m) in messages.iter().enumerate() {
        let Some(parts) = m.get("content").and_then(|c| c.as_array()) else { continue };
        for (j, part) in parts.iter().enumerate() {
            let Some(obj) = part.as_object() else { continue };
            let kind = obj.get("type").and_then(|t| t.as_str()).unwrap_or("");
            if let Some(k) =
                obj.iter().find(|(k, x)| *k != "type" && *k != kind && !x.is_null()).map(|e| e.0)
            {
                return Some(format!("messages[{i}].content[{j}].{k}"));
            }
        }
    }
    None
}

/// Deserialises `T` from `v` in one pass, naming the offending field in an error, and returns
/// the paths `T` left unread, written as `messages[1].tool_calls`.
fn typed<T: serde::de::DeserializeOwned>(
    v: &serde_json::Value,
) -> Result<(T, Vec<String>), ApiError> {
    let mut unread = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(v, &mut track);
    // serde_ignored writes `messages.1.tool_calls`, with `?` for a step into an `Option`.
    let mut note = |p: serde_ignored::Path<'_>| {
        let mut out = String::new();
        for seg in p.to_string().split('.').filter(|s| *s != "?") {
            match seg.parse::<usize>() {
                Ok(i) => out.push_str(&format!("[{i}]")),
                Err(_) if out.is_empty() => out.push_str(seg),
                Err(_) => out.push_str(&format!(".{seg}")),
            }
        }
        unread.push(out)
    };
    let parsed = T::deserialize(serde_ignored::Deserializer::new(de, &mut note));
    match parsed {
        Ok(t) => Ok((t, unread)),
        Err(inner) => {
            let path = track.path().to_string();
            let param = (path != "." && !path.is_empty()).then_some(path);
            let msg = match &param {
                Some(p) => format!("invalid value for '{p}': {inner}"),
                None => format!("invalid request body: {inner}"),
            };
            Err(ApiError::invalid(param.as_deref(), msg))
        }
    }
}

/// A JSON integer as the unsigned count the engine takes (the engine's rules then bound it).
fn count(param: &str, v: i64) -> Result<usize, ApiError> {
    usize::try_from(v).map_err(|_| {
        ApiError::invalid(Some(param), format!("{param} must be a non-negative integer, got {v}"))
    })
}

/// The sampling parameters as the request gives them (without `max_tokens`, which needs the
/// prompt length). Only what JSON can say and the engine's types cannot is checked here; the
/// rules every value must meet are [`SamplingParams::validate`]'s, applied once `max_tokens` is
/// known ([`check_params`]).
pub fn sampling_params(
    c: &CommonParams,
    logprobs: Option<usize>,
) -> Result<SamplingParams, ApiError> {
    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopInput::One(s)) => vec![s.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    // OpenAI's keys are token ids as strings; the engine bounds ids and values.
    let mut logit_bias = Vec::new();
    for (k, &b) in c.logit_bias.iter().flatten() {
        let t = k.trim().parse::<u32>().map_err(|_| {
            ApiError::invalid(
                Some("logit_bias"),
                format!("logit_bias keys are token ids, got '{k}'"),
            )
        })?;
        logit_bias.push((t, b as f32));
    }
    logit_bias.sort_by_key(|&(t, _)| t);
    let top_k = c.top_k.unwrap_or(0);
    let top_k = i32::try_from(top_k).map_err(|_| {
        ApiError::invalid(
            Some("top_k"),
            format!("top_k must be -1 (disabled) or a positive count, got {top_k}"),
        )
    })?;
    let d = SamplingParams::default();
    let f = |v: Option<f64>, default: f32| v.map_or(default, |v| v as f32);
    Ok(SamplingParams {
        n: count("n", c.n.unwrap_or(1))?,
        temperature: f(c.temperature, d.temperature),
        top_p: f(c.top_p, d.top_p),
        top_k,
        min_p: f(c.min_p, d.min_p),
        presence_penalty: f(c.presence_penalty, d.presence_penalty),
        frequency_penalty: f(c.frequency_penalty, d.frequency_penalty),
        repetition_penalty: f(c.repetition_penalty, d.repetition_penalty),
        max_tokens: 1,
        min_tokens: count("min_tokens", c.min_tokens.unwrap_or(0))?,
        stop,
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        include_stop_str_in_output: c.include_stop_str_in_output.unwrap_or(false),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        logprobs,
        seed: c.seed.map(|s| count("seed", s).map(|s| s as u64)).transpose()?,
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        detokenize: true,
        logit_bias,
        structured: None,
        prompt_logprobs: match c.prompt_logprobs {
            Some(_) if c.stream == Some(true) => {
                return Err(ApiError::invalid(
                    Some("prompt_logprobs"),
                    "prompt_logprobs are answered whole: they cannot be streamed",
                ))
            }
            k => k.map(|k| logprob_count("prompt_logprobs", k)).transpose()?,
        },
        // Set by `beam::apply` once the request is known to ask for it.
        beam_search: None,
    })
}

/// Applies the engine's parameter rules ([`SamplingParams::validate`]), naming the parameter
/// in the OpenAI error.
pub fn check_params(p: &SamplingParams, vocab_size: usize) -> Result<(), ApiError> {
    p.validate(vocab_size).map_err(|e| ApiError::invalid(Some(e.param), e.message))
}

/// The completion budget: `requested` if it fits, else an error saying by how much the request
/// exceeds the context; with no request, what is left of the context (or `default`).
pub fn max_tokens(
    param: &str,
    requested: Option<i64>,
    default: Option<usize>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<usize, ApiError> {
    if prompt_len == 0 {
        return Err(ApiError::invalid(Some("prompt"), "the prompt is empty"));
    }
    if prompt_len >= max_model_len {
        return Err(ApiError::invalid(
            Some("messages"),
            format!("This model's maximum context length is {max_model_len} tokens. However, your prompt has {prompt_len} tokens, leaving no room for a completion. Please reduce the length of the prompt."),
        ));
    }
    match requested {
        Some(m) if m < 1 => Err(ApiError::invalid(Some(param), format!("{param} must be at least 1, got {m}"))),
        // Compared without adding, so no value can wrap past the check.
        Some(m) if m as u64 > (max_model_len - prompt_len) as u64 => Err(ApiError::invalid(
            Some(param),
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {m} in the completion). Please reduce the length of the prompt or of the completion.",
                prompt_len as i128 + m as i128
            ),
        )),
        Some(m) => Ok(m as usize),
        None => Ok(default.unwrap_or(usize::MAX).min(max_model_len - prompt_len)),
    }
}

/// Checks `logprobs`-style counts.
pub fn logprob_count(param: &str, v: i64) -> Result<usize, ApiError> {
    if v < 0 || v as usize > MAX_LOGPROBS {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param} must be between 0 and {MAX_LOGPROBS}, got {v}"),
        ));
    }
    Ok(v as usize)
}

/// The conversation as the chat template sees it.
pub fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid(
                Some(&format!("messages[{i}].role")),
                format!(
                    "unknown role '{}' (expected system, developer, user, assistant or tool)",
                    m.role
                ),
            ));
        }
        let text = match &m.content {
            // Only an assistant turn may come without content (OpenAI's rule: one that made
            // tool calls); any other message must say something.
            None if m.role == "assistant" => String::new(),
            None => {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].content")),
                    format!(
                        "a {} message needs content (a string or a list of text parts), got null",
                        m.role
                    ),
                ))
            }
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => t.push_str(s),
                        ("text", None) => return Err(ApiError::invalid(Some(&format!("messages[{i}].content[{j}].text")), "a text part needs 'text'")),
                        (k, _) => return Err(ApiError::invalid(Some(&format!("messages[{i}].content[{j}].type")), format!("content parts of type '{k}' are not supported; this model reads text only"))),
                    }
                }
                t
            }
        };
        let role = if m.role == "developer" { "system" } else { m.role.as_str() };
        let mut msg = ChatMessage::new(role, &text);
        if let Some(calls) = m.tool_calls.as_deref().filter(|c| !c.is_empty()) {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].tool_calls")),
                    "only assistant messages carry tool_calls",
                ));
            }
            msg.tool_calls = Some(crate::tools::history_calls(i, calls)?);
        }
        match (role, &m.tool_call_id) {
            ("tool", None) => {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].tool_call_id")),
                    "a tool message needs the tool_call_id of the call it answers",
                ))
            }
            ("tool", id) => msg.tool_call_id = id.clone(),
            (_, Some(_)) => {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].tool_call_id")),
                    "only tool messages carry tool_call_id",
                ))
            }
            _ => {}
        }
        out.push(msg);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_nobody_reads_are_refused_by_name() {
        let refused = |body: &str| {
            let e = match body.contains("messages") {
                true => parse_body::<ChatRequest>(body.as_bytes()).map(|_| ()),
                false => parse_body::<CompletionRequest>(body.as_bytes()).map(|_| ()),
            };
            e.err().and_then(|e| e.param)
        };
        let cases = [
            (
                r#"{"model": "m", "prompt": "x", "guided_decoding_backend": "xgrammar"}"#,
                Some("guided_decoding_backend"),
            ),
            (
                r#"{"model": "m", "prompt": "x", "structured_outputs": {"choice": ["a"], "disable_fallback": true}}"#,
                Some("structured_outputs.disable_fallback"),
            ),
            (
                r#"{"model": "m", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "anything": 1}}, "x": 2}}"#,
                Some("response_format"),
            ),
            (r#"{"model": "m", "prompt": "x", "guided_choice": ["a", "b"]}"#, None),
            (r#"{"model": "m", "prompt": "x", "grammar": "root ::= \"a\""}"#, None),
            (r#"{"model": "m", "prompt": "x", "n_probs": 3}"#, Some("n_probs")),
            (r#"{"model": "m", "prompt": "x", "prompt_logprobs": 2}"#, None),
            (
                r#"{"model": "m", "prompt": "x", "stream_options": {"include_usage": true, "x": 1}}"#,
                Some("stream_options.x"),
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}, "extra": 1}]}]}"#,
                Some("messages[1].tool_calls[0].extra"),
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}"#,
                Some("messages[0].content[0].cache_control"),
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}"#,
                None,
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "store": true}"#,
                Some("store"),
            ),
            (r#"{"model": "m", "prompt": "x", "stream_options": {"x": null}}"#, None),
            // Read fields of either struct, and unknown fields set to null, pass.
            (r#"{"model": "m", "prompt": "x", "temperature": 0, "echo": true, "top_k": 3}"#, None),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "seed": 1, "metadata": null}"#,
                None,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(refused(body).as_deref(), want, "{body}");
        }
    }

    #[test]
    fn parse_errors_name_the_field() {
        let e = parse_body::<CompletionRequest>(
            br#"{"model": "m", "prompt": "x", "temperature": "hot"}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
        let e = parse_body::<CompletionRequest>(br#"{"model": "m", "prompt": 4}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"), "{e:?}");
        let e = parse_body::<CompletionRequest>(b"[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{e:?}");
        let e = parse_body::<CompletionRequest>(
            br#"{"model": "m", "prompt": "x", "temperature": "hot"}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
        let e = parse_body::<CompletionRequest>(b"{not json").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        let e = parse_body::<CompletionRequest>(b"").unwrap_err();
        assert!(e.message.contains("empty"), "{e:?}");
    }

    #[test]
    fn budget() {
        assert_eq!(max_tokens("max_tokens", Some(10), None, 5, 100).unwrap(), 10);
        assert_eq!(max_tokens("max_tokens", None, None, 5, 100).unwrap(), 95);
        assert_eq!(max_tokens("max_tokens", None, Some(16), 5, 100).unwrap(), 16);
        assert!(max_tokens("max_tokens", Some(96), None, 5, 100)
            .unwrap_err()
            .message
            .contains("maximum context length is 100"));
        assert!(max_tokens("max_tokens", Some(0), None, 5, 100).is_err());
        assert!(max_tokens("max_tokens", Some(-3), None, 5, 100).is_err());
        // The largest value cannot wrap past the check, and the error reports it as sent.
        let e = max_tokens("max_tokens", Some(i64::MAX), None, 5, 100).unwrap_err();
        assert!(
            e.message.contains(&format!(
                "{} tokens (5 in the prompt, {} in the completion)",
                i64::MAX as i128 + 5,
                i64::MAX
            )),
            "{}",
            e.message
        );
        assert!(max_tokens("max_tokens", None, None, 100, 100).is_err());
    }

    #[test]
    fn ranges() {
        // The engine's rules, applied by the router, name the parameter.
        let checked = |c: CommonParams| {
            sampling_params(&c, None).and_then(|p| check_params(&p, 100)).unwrap_err().param
        };
        let c = CommonParams { temperature: Some(2.5), ..Default::default() };
        assert_eq!(checked(c).as_deref(), Some("temperature"));
        let c = CommonParams { n: Some(0), ..Default::default() };
        assert_eq!(checked(c).as_deref(), Some("n"));
        let c = CommonParams { stop_token_ids: Some(vec![100]), ..Default::default() };
        assert_eq!(checked(c).as_deref(), Some("stop_token_ids"));
        // What JSON can say and the engine's types cannot is refused before.
        let c = CommonParams { n: Some(-3), ..Default::default() };
        assert_eq!(sampling_params(&c, None).unwrap_err().param.as_deref(), Some("n"));
        let c = CommonParams { seed: Some(-1), ..Default::default() };
        assert_eq!(sampling_params(&c, None).unwrap_err().param.as_deref(), Some("seed"));
        let c = CommonParams {
            stop: Some(StopInput::One("\n".into())),
            seed: Some(3),
            ..Default::default()
        };
        let p = sampling_params(&c, Some(2)).unwrap();
        assert_eq!(
            (p.stop.clone(), p.seed, p.logprobs),
            (vec!["\n".to_string()], Some(3), Some(2))
        );
    }
}
