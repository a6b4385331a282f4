//! OpenAI response bodies: whole responses, streamed chunks, log-probabilities and usage,
//! built from the decode workers' deltas.

use serde_json::{json, Value};
use tandem_engine::model_files::tokenizer::Tokenizer;
use tandem_proto::v1 as pb;

/// Which endpoint's shapes to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// The metrics label of the endpoint.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat_completions",
        }
    }
}

/// One choice accumulated from its deltas (non-streaming responses).
#[derive(Debug, Default, Clone)]
pub struct Choice {
    /// Text so far.
    pub text: String,
    /// Tokens generated.
    pub num_tokens: usize,
    /// Log-probabilities of the tokens, when asked for.
    pub logprobs: Vec<pb::SampledToken>,
    /// Finish reason.
    pub finish_reason: Option<String>,
    /// Stop string or token (JSON null, a string or an integer).
    pub stop_reason: Value,
    /// Sum of the generated tokens' log-probabilities.
    pub cumulative_logprob: f64,
}

impl Choice {
    /// Adds a delta.
    pub fn push(&mut self, d: &pb::CompletionDelta) {
        self.text.push_str(&d.text);
        self.num_tokens += d.token_ids.len();
        self.logprobs.extend(d.logprobs.iter().cloned());
        self.cumulative_logprob = d.cumulative_logprob;
        if !d.finish_reason.is_empty() {
            self.finish_reason = Some(d.finish_reason.clone());
            self.stop_reason = stop_reason(d);
        }
    }
}

/// vLLM's `stop_reason` of a finished completion: the matched stop string, the stop token id
/// (an integer), or null (end-of-sequence, length, abort).
pub fn stop_reason(d: &pb::CompletionDelta) -> Value {
    match (d.stop_reason.is_empty(), d.stop_token_id) {
        (false, _) => Value::String(d.stop_reason.clone()),
        (true, Some(t)) => Value::from(t),
        (true, None) => Value::Null,
    }
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// The legacy completions `logprobs` object; `offset` is where the text of these tokens starts.
pub fn completion_logprobs(tok: &Tokenizer, lps: &[pb::SampledToken], mut offset: usize) -> Value {
    let (mut tokens, mut token_lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for s in lps {
        let Some(c) = &s.chosen else { continue };
        let t = token_text(tok, c.token_id);
        offsets.push(offset);
        offset += t.len();
        tokens.push(t);
        token_lps.push(c.logprob);
        // Most likely first: kept as [token, logprob] pairs until [`Wire`] writes the object.
        tops.push(Value::Array(
            s.top.iter().map(|a| json!([token_text(tok, a.token_id), a.logprob])).collect(),
        ));
    }
    json!({ "tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets })
}

/// The completions `logprobs` of an echoed prompt and its completion: the prompt's first token
/// (with null log-probability, as OpenAI writes it), the prompt's scored tokens, then the
/// completion's entries (`completion`, whose offsets already start after the echoed text).
pub fn echo_logprobs(
    tok: &Tokenizer,
    prompt: &[u32],
    scored: &[pb::SampledToken],
    completion: &Value,
) -> Value {
    let first = prompt.first().map(|&t| token_text(tok, t)).unwrap_or_default();
    let rest = completion_logprobs(tok, scored, first.len());
    let mut out = json!({ "tokens": [first], "token_logprobs": [null], "top_logprobs": [null], "text_offset": [0] });
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        let arr = out[key].as_array_mut().expect("built above");
        arr.extend(rest[key].as_array().into_iter().flatten().cloned());
        arr.extend(completion[key].as_array().into_iter().flatten().cloned());
    }
    out
}

/// `scored` with at most `k` alternatives each (the engine scores the prompt once, with as
/// many as any use asked for).
pub fn with_top(scored: &[pb::SampledToken], k: usize) -> Vec<pb::SampledToken> {
    scored
        .iter()
        .map(|s| pb::SampledToken { top: s.top.iter().take(k).cloned().collect(), ..s.clone() })
        .collect()
}

/// vLLM's `prompt_logprobs`: null for the prompt's first token, then per token an object from
/// token id (as text) to `{logprob, rank, decoded_token}`: the prompt's own token (its rank
/// among all tokens) and the `k` most likely (ranks 1..=k).
pub fn prompt_logprobs(
    tok: &Tokenizer,
    prompt: &[u32],
    scored: &[pb::SampledToken],
    k: usize,
) -> Value {
    let entry = |id: u32, logprob: f32, rank: u32| json!({ "logprob": logprob, "rank": rank, "decoded_token": token_text(tok, id) });
    let mut out = vec![Value::Null; prompt.len().min(1)];
    for s in scored {
        let Some(c) = &s.chosen else { continue };
        let mut m = serde_json::Map::new();
        for (i, a) in s.top.iter().take(k).enumerate() {
            m.insert(a.token_id.to_string(), entry(a.token_id, a.logprob, i as u32 + 1));
        }
        let rank = s.rank.unwrap_or(0);
        m.insert(c.token_id.to_string(), entry(c.token_id, c.logprob, rank));
        out.push(Value::Object(m));
    }
    Value::Array(out)
}

/// A response as it goes on the wire. A completions `top_logprobs` entry is held as a list of
/// `[token, logprob]` pairs, most likely first, and written as the object OpenAI's API returns
/// with its keys in that order (a `serde_json` map would sort them by token text).
pub struct Wire<'a>(pub &'a Value);

impl serde::Serialize for Wire<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(m) => {
                let mut out = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    match (k.as_str(), v) {
                        // (An echoed prompt's first token has no alternatives: null.)
                        ("top_logprobs", Value::Array(rows))
                            if rows.iter().all(|r| r.is_null() || is_pairs(r)) =>
                        {
                            out.serialize_entry(k, &rows.iter().map(Pairs).collect::<Vec<_>>())?
                        }
                        _ => out.serialize_entry(k, &Wire(v))?,
                    }
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    out.serialize_element(&Wire(v))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

/// Whether `v` is a list of `[token, logprob]` pairs.
fn is_pairs(v: &Value) -> bool {
    v.as_array().is_some_and(|ps| {
        ps.iter().all(|p| p.as_array().is_some_and(|p| p.len() == 2 && p[0].is_string()))
    })
}

/// `[[token, logprob], …]` written as `{token: logprob, …}` in list order.
struct Pairs<'a>(&'a Value);

impl serde::Serialize for Pairs<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.0.is_null() {
            return s.serialize_none();
        }
        let pairs = self.0.as_array().map(Vec::as_slice).unwrap_or_default();
        let mut out = s.serialize_map(Some(pairs.len()))?;
        for p in pairs {
            out.serialize_entry(p[0].as_str().unwrap_or_default(), &p[1])?;
        }
        out.end()
    }
}

/// The chat `logprobs` object (`{"content": [...]}`).
pub fn chat_logprobs(tok: &Tokenizer, lps: &[pb::SampledToken]) -> Value {
    let entry = |id: u32, lp: f32| {
        let t = token_text(tok, id);
        json!({ "token": t, "logprob": lp, "bytes": t.as_bytes() })
    };
    let content: Vec<Value> = lps
        .iter()
        .filter_map(|s| {
            let c = s.chosen.as_ref()?;
            let mut e = entry(c.token_id, c.logprob);
            e["top_logprobs"] =
                Value::Array(s.top.iter().map(|a| entry(a.token_id, a.logprob)).collect());
            Some(e)
        })
        .collect();
    json!({ "content": content })
}

/// `usage`.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({ "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens })
}

/// What a response is about.
pub struct Header<'a> {
    /// Response id.
    pub id: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: &'a str,
}

/// A whole (non-streaming) response.
pub fn full_response(
    ep: Endpoint,
    h: &Header,
    tok: &Tokenizer,
    choices: &[Choice],
    logprobs: bool,
    prompt_tokens: usize,
    echo: &[Option<String>],
) -> Value {
    let completion_tokens: usize = choices.iter().map(|c| c.num_tokens).sum();
    let n_per_prompt = choices.len() / echo.len().max(1);
    let items: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match ep {
            Endpoint::Completions => {
                let prefix = echo.get(i / n_per_prompt.max(1)).cloned().flatten().unwrap_or_default();
                let lp = if logprobs { completion_logprobs(tok, &c.logprobs, prefix.len()) } else { Value::Null };
                json!({ "index": i, "text": format!("{prefix}{}", c.text), "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason })
            }
            Endpoint::Chat => {
                let lp = if logprobs { chat_logprobs(tok, &c.logprobs) } else { Value::Null };
                json!({ "index": i, "message": { "role": "assistant", "content": c.text }, "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason })
            }
        })
        .collect();
    let object = match ep {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion",
    };
    json!({ "id": h.id, "object": object, "created": h.created, "model": h.model, "choices": items, "usage": usage(prompt_tokens, completion_tokens) })
}

/// The `timing` extension of a response (seed 001's data model, in milliseconds): `queue` is the
/// router's own time before dispatch plus the decode worker's wait before the prompt's
/// computation began (here or on a prefill worker), `prefill` runs to the first token, `decode`
/// from there to the end, `total` is the router's clock from receipt to this response. The
/// worker's parts are durations on its own clock, so no two machines' clocks are compared.
pub fn timing(
    dispatch: std::time::Duration,
    t: &pb::RequestTiming,
    total: std::time::Duration,
) -> Value {
    let ms = |s: f64| (s * 1000.0).max(0.0);
    let total = ms(total.as_secs_f64());
    let worker_queue =
        if t.first_scheduled_time > 0.0 { t.first_scheduled_time - t.arrival_time } else { 0.0 };
    let queue = ms(dispatch.as_secs_f64()) + ms(worker_queue);
    let prefill = if t.first_token_time > 0.0 && t.first_scheduled_time > 0.0 {
        ms(t.first_token_time - t.first_scheduled_time)
    } else {
        0.0
    };
    let decode = if t.finished_time > 0.0 && t.first_token_time > 0.0 {
        ms(t.finished_time - t.first_token_time)
    } else {
        (total - queue - prefill).max(0.0)
    };
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({ "queue_time_ms": round(queue), "prefill_time_ms": round(prefill), "decode_time_ms": round(decode), "total_time_ms": round(total) })
}

/// One streamed chunk with the given choices.
pub fn chunk(ep: Endpoint, h: &Header, choices: Vec<Value>) -> Value {
    let object = match ep {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    json!({ "id": h.id, "object": object, "created": h.created, "model": h.model, "choices": choices })
}

/// A streamed choice for a delta. `offset` is the length of the choice's text so far.
#[allow(clippy::too_many_arguments)]
pub fn chunk_choice(
    ep: Endpoint,
    tok: &Tokenizer,
    index: usize,
    text: &str,
    lps: &[pb::SampledToken],
    logprobs: bool,
    offset: usize,
    finish: Option<&str>,
    stop_reason: Value,
) -> Value {
    match ep {
        Endpoint::Completions => {
            let lp = if logprobs { completion_logprobs(tok, lps, offset) } else { Value::Null };
            json!({ "index": index, "text": text, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason })
        }
        Endpoint::Chat => {
            let lp = if logprobs { chat_logprobs(tok, lps) } else { Value::Null };
            let delta = if text.is_empty() && finish.is_some() {
                json!({})
            } else {
                json!({ "content": text })
            };
            json!({ "index": index, "delta": delta, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason })
        }
    }
}

/// A streamed chunk of one choice's plain text delta (no log-probabilities, no tool calls),
/// written straight to JSON: the same bytes as `chunk(ep, h, vec![chunk_choice(..)])` with
/// `timing` set when given, without building a `Value` tree for every token.
pub fn text_chunk_json(
    ep: Endpoint,
    h: &Header,
    index: usize,
    text: &str,
    finish: Option<&str>,
    stop_reason: &Value,
    timing: Option<&Value>,
) -> String {
    let chat = ep == Endpoint::Chat;
    let c = TextChunk {
        id: h.id,
        object: if chat { "chat.completion.chunk" } else { "text_completion" },
        created: h.created,
        model: h.model,
        choices: [TextChoice {
            index,
            text: (!chat).then_some(text),
            delta: chat.then(|| Delta {
                content: (!(text.is_empty() && finish.is_some())).then_some(text),
            }),
            logprobs: (),
            finish_reason: finish,
            stop_reason,
        }],
        timing,
    };
    serde_json::to_string(&c).unwrap_or_default()
}

#[derive(serde::Serialize)]
struct TextChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [TextChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    timing: Option<&'a Value>,
}

#[derive(serde::Serialize)]
struct TextChoice<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Delta<'a>>,
    /// Always `null` here.
    logprobs: (),
    finish_reason: Option<&'a str>,
    stop_reason: &'a Value,
}

#[derive(serde::Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

/// The chat stream's opening choice: the assistant role with empty content.
pub fn chat_role_choice(index: usize) -> Value {
    json!({ "index": index, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_chunks_written_directly_match_the_value_built_ones() {
        // Without log-probabilities the tokenizer is not consulted.
        let tok = Tokenizer::ids_only();
        let h = Header { id: "cmpl-1\"x", created: 1_796_000_000, model: "m/ü" };
        let timing = json!({ "queue_time_ms": 1.5, "total_time_ms": 9.0 });
        for ep in [Endpoint::Completions, Endpoint::Chat] {
            for text in ["", "Hello", "a \"quote\"\n\ttab \u{1F600} \\ \u{1}"] {
                for finish in [None, Some("stop"), Some("length")] {
                    for stop in [Value::Null, Value::from(7u32), Value::from("</s>")] {
                        for t in [None, Some(&timing)] {
                            let c = chunk_choice(
                                ep,
                                &tok,
                                3,
                                text,
                                &[],
                                false,
                                0,
                                finish,
                                stop.clone(),
                            );
                            let mut v = chunk(ep, &h, vec![c]);
                            if let Some(t) = t {
                                v["timing"] = t.clone();
                            }
                            let want = serde_json::to_string(&Wire(&v)).unwrap();
                            let got = text_chunk_json(ep, &h, 3, text, finish, &stop, t);
                            assert_eq!(got, want, "{ep:?} {text:?} {finish:?} {stop} {t:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn completion_top_logprobs_keep_probability_order_on_the_wire() {
        let v = json!({ "choices": [{
            "logprobs": { "tokens": ["b"], "top_logprobs": [[["zeta", -0.1], ["alpha", -2.5], ["mid", -3.0]]] },
            // Chat's entries are objects in a list: written as they are.
            "chat": { "top_logprobs": [{ "token": "z", "logprob": -0.5 }, { "token": "a", "logprob": -1.0 }] },
        }] });
        let wire = serde_json::to_string(&Wire(&v)).unwrap();
        let (z, a, m) = (
            wire.find("\"zeta\"").unwrap(),
            wire.find("\"alpha\"").unwrap(),
            wire.find("\"mid\"").unwrap(),
        );
        assert!(z < a && a < m, "{wire}");
        let back: Value = serde_json::from_str(&wire).unwrap();
        assert_eq!(
            back["choices"][0]["logprobs"]["top_logprobs"][0],
            json!({ "zeta": -0.1, "alpha": -2.5, "mid": -3.0 })
        );
        assert_eq!(back["choices"][0]["chat"], v["choices"][0]["chat"]);
        assert_eq!(back["choices"][0]["logprobs"]["tokens"], json!(["b"]));
    }
}
