//! Tool calls read out of a streamed output as it arrives: content deltas until a call block
//! begins, then each call's id and name, then its arguments piece by piece, in OpenAI's chunk
//! format (`tools.rs` reads whole outputs).

use serde_json::{json, Value};

use crate::tool_format::{CallsStart, ToolCallFormat};
use crate::tools::call_id;

/// What a streamed output becomes, step by step.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Plain content.
    Content(String),
    /// A call begins: its index, id and function name (arguments follow).
    Start {
        /// Index among the output's calls.
        index: usize,
        /// Its id.
        id: String,
        /// Function name.
        name: String,
    },
    /// More argument text of call `index`.
    Args {
        /// Index among the output's calls.
        index: usize,
        /// JSON text to append.
        text: String,
    },
}

/// Turns an output's text deltas into content and call deltas as they arrive. Calls written as
/// the grammar writes them (`{"name": "f", "arguments": {...}}`, or `"parameters"` in Llama 3's
/// format) stream their arguments piece by piece; any other well-formed call is sent whole when
/// the output ends.
#[derive(Debug, Default)]
pub struct CallStream {
    text: String,
    names: Vec<String>,
    format: ToolCallFormat,
    content_sent: usize,
    /// Per call begun: arguments bytes sent.
    sent: Vec<usize>,
    /// The output left the streamable form: the rest is decided at the end.
    irregular: bool,
}

/// Where a streamable call stands in the text: its name, and its arguments' span so far.
struct CallSpan {
    name: String,
    args_start: usize,
    args_end: usize,
    complete: bool,
}

impl CallStream {
    /// A stream that reads calls to these functions, written in `format`.
    pub fn new(format: ToolCallFormat, names: Vec<String>) -> Self {
        CallStream { names, format, ..Default::default() }
    }

    /// Whether any call was sent.
    pub fn has_calls(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Adds a text delta; `done` when the output has ended. Returns what to send.
    pub fn push(&mut self, delta: &str, done: bool) -> Vec<StreamEvent> {
        self.text.push_str(delta);
        let mut ev = Vec::new();
        let start = self.format.calls_start(&self.text);
        // Content: up to the first call, holding back a tail that may begin one.
        let (content_end, first) = match start {
            CallsStart::At { content, calls } => (content, Some(calls)),
            CallsStart::NotYet { .. } if done => (self.text.len(), None),
            CallsStart::NotYet { hold } => (self.text.len() - hold, None),
        };
        if content_end > self.content_sent {
            let piece = &self.text[self.content_sent..content_end];
            let piece = if first.is_some() { piece.trim_end() } else { piece };
            if !piece.is_empty() {
                ev.push(StreamEvent::Content(piece.to_string()));
            }
            self.content_sent = content_end;
        }
        let Some(first) = first else { return ev };
        if !self.irregular {
            match spans(&self.text[first..], self.format) {
                Some(spans) => {
                    for (k, s) in spans.iter().enumerate() {
                        if k == self.sent.len() {
                            if !self.names.contains(&s.name) {
                                self.irregular = true;
                                break;
                            }
                            ev.push(StreamEvent::Start {
                                index: k,
                                id: call_id(),
                                name: s.name.clone(),
                            });
                            self.sent.push(0);
                        }
                        let (a, b) = (first + s.args_start + self.sent[k], first + s.args_end);
                        if b > a {
                            ev.push(StreamEvent::Args {
                                index: k,
                                text: self.text[a..b].to_string(),
                            });
                            self.sent[k] = s.args_end - s.args_start;
                        }
                        if !s.complete {
                            break;
                        }
                    }
                }
                None => self.irregular = true,
            }
        }
        if done && self.irregular && self.sent.is_empty() {
            // Decided on the whole text: well-formed calls are sent whole, anything else is
            // content.
            match self.format.parse_calls(&self.text, &self.names) {
                Some((_, calls)) => {
                    for (k, c) in calls.into_iter().enumerate() {
                        ev.push(StreamEvent::Start { index: k, id: call_id(), name: c.name });
                        ev.push(StreamEvent::Args { index: k, text: c.arguments });
                        self.sent.push(0);
                    }
                }
                None => ev.push(StreamEvent::Content(self.text[first..].to_string())),
            }
        }
        ev
    }
}

/// The streamed chat choices for one text delta of choice `index` with tools: content and call
/// deltas in OpenAI's chunk format, then, when `finish` is given, a closing choice whose finish
/// reason is `tool_calls` if the output made calls. `logprobs` rides on the first choice.
pub fn chunk_choices(
    cs: &mut CallStream,
    index: usize,
    text: &str,
    finish: Option<&str>,
    mut logprobs: Value,
) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for e in cs.push(text, finish.is_some()) {
        let delta = match e {
            StreamEvent::Content(t) => json!({ "content": t }),
            StreamEvent::Start { index: k, id, name } => json!({ "tool_calls": [{
                "index": k, "id": id, "type": "function", "function": { "name": name, "arguments": "" }
            }] }),
            StreamEvent::Args { index: k, text } => {
                json!({ "tool_calls": [{ "index": k, "function": { "arguments": text } }] })
            }
        };
        out.push(json!({ "index": index, "delta": delta, "logprobs": logprobs.take(), "finish_reason": null }));
    }
    if let Some(f) = finish {
        let f = if cs.has_calls() { "tool_calls" } else { f };
        out.push(
            json!({ "index": index, "delta": {}, "logprobs": logprobs.take(), "finish_reason": f }),
        );
    }
    out
}

/// The calls in `text` (which starts with the first) as far as they go, in the form the grammar
/// writes: `<tool_call>\n{"name": "f", "arguments": <object>}\n</tool_call>` (Hermes) or
/// `{"name": "f", "parameters": <object>}` joined by `;` (Llama 3); None when the text leaves
/// that form.
fn spans(text: &str, format: ToolCallFormat) -> Option<Vec<CallSpan>> {
    let mut out = Vec::new();
    let mut p = Scan { s: text, i: 0 };
    let args_key = format!("\"{}\"", format.args_key());
    loop {
        // Each step either completes or runs out of text (then what is known is returned).
        macro_rules! step {
            ($e:expr) => {
                match $e {
                    Some(true) => {}
                    Some(false) => return None,
                    None => return Some(out),
                }
            };
        }
        if !out.is_empty() {
            step!(p.lit(format.between()));
            p.ws();
        }
        step!(p.lit(format.open()));
        p.ws();
        step!(p.lit("{"));
        p.ws();
        step!(p.lit("\"name\""));
        p.ws();
        step!(p.lit(":"));
        p.ws();
        let name = match p.string() {
            Some(Some(n)) => n,
            Some(None) => return None,
            None => return Some(out),
        };
        p.ws();
        step!(p.lit(","));
        p.ws();
        step!(p.lit(&args_key));
        p.ws();
        step!(p.lit(":"));
        p.ws();
        if p.i >= text.len() {
            return Some(out);
        }
        if text.as_bytes()[p.i] != b'{' {
            return None;
        }
        let args_start = p.i;
        let (args_end, complete) = p.value_end();
        out.push(CallSpan { name, args_start, args_end, complete });
        if !complete {
            return Some(out);
        }
        p.i = args_end;
        p.ws();
        step!(p.lit("}"));
        p.ws();
        step!(p.lit(format.close()));
        p.ws();
        if p.i >= text.len() {
            return Some(out);
        }
    }
}

/// A cursor over the output text.
struct Scan<'a> {
    s: &'a str,
    i: usize,
}

impl Scan<'_> {
    fn ws(&mut self) {
        while self.s.as_bytes().get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    /// `lit` next: Some(true) taken, Some(false) something else, None the text ends within it.
    fn lit(&mut self, lit: &str) -> Option<bool> {
        let rest = &self.s[self.i..];
        if rest.starts_with(lit) {
            self.i += lit.len();
            Some(true)
        } else if lit.starts_with(rest) {
            None
        } else {
            Some(false)
        }
    }

    /// A JSON string: Some(Some(s)) read, Some(None) not a string, None the text ends within it.
    fn string(&mut self) -> Option<Option<String>> {
        let b = self.s.as_bytes();
        if self.i >= b.len() {
            return None;
        }
        if b[self.i] != b'"' {
            return Some(None);
        }
        let mut j = self.i + 1;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => {
                    let v = serde_json::from_str::<String>(&self.s[self.i..=j]).ok();
                    self.i = j + 1;
                    return Some(v);
                }
                _ => j += 1,
            }
        }
        None
    }

    /// Where the JSON object or array at the cursor ends (exclusive) and whether it did; for an
    /// unfinished one, how far it may be sent (the whole text so far).
    fn value_end(&self) -> (usize, bool) {
        let b = self.s.as_bytes();
        let (mut depth, mut in_str, mut j) = (0usize, false, self.i);
        while j < b.len() {
            let c = b[j];
            if in_str {
                match c {
                    b'\\' => j += 1,
                    b'"' => in_str = false,
                    _ => {}
                }
            } else {
                match c {
                    b'"' => in_str = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return (j + 1, true);
                        }
                    }
                    _ => {}
                }
            }
            j += 1;
        }
        // Never split a multi-byte character.
        let mut end = b.len().min(j);
        while !self.s.is_char_boundary(end) {
            end -= 1;
        }
        (end, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "add".into()]
    }

    /// The events of an output cut into deltas, folded into (content, calls).
    fn stream(text: &str, cut: usize) -> (String, Vec<(String, String)>) {
        stream_in(ToolCallFormat::Hermes, text, cut)
    }

    fn stream_in(f: ToolCallFormat, text: &str, cut: usize) -> (String, Vec<(String, String)>) {
        let mut s = CallStream::new(f, names());
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let pieces: Vec<String> = chars.chunks(cut).map(|c| c.iter().collect()).collect();
        for (i, p) in pieces.iter().enumerate() {
            for e in s.push(p, i + 1 == pieces.len()) {
                match e {
                    StreamEvent::Content(t) => content.push_str(&t),
                    StreamEvent::Start { index, id, name } => {
                        assert_eq!(index, calls.len());
                        assert!(id.starts_with("call_") && id.len() == 29);
                        calls.push((name, String::new()));
                    }
                    StreamEvent::Args { index, text } => calls[index].1.push_str(&text),
                }
            }
        }
        (content, calls)
    }

    #[test]
    fn streamed_deltas_join_into_the_whole_parse_at_any_cut() {
        let forced = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\\\"\", \"n\": [1, {\"x\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"日本\"}}\n</tool_call>";
        let auto = "Sure <tool>, one moment.\n<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"add\"}\n</tool_call>";
        for cut in [1, 2, 3, 7, 1000] {
            let (content, calls) = stream(forced, cut);
            assert_eq!(content, "");
            assert_eq!(calls.len(), 2, "cut {cut}");
            assert_eq!(calls[0].0, "get_weather");
            let args: Value = serde_json::from_str(&calls[0].1).unwrap();
            assert_eq!(args["city"], "Pa}ris\"");
            assert_eq!(serde_json::from_str::<Value>(&calls[1].1).unwrap()["a"], "日本");
            // Another key order: sent whole at the end.
            let (content, calls) = stream(auto, cut);
            // (Whitespace sent before the block began stays sent.)
            assert_eq!(content.trim_end(), "Sure <tool>, one moment.");
            assert_eq!(calls, vec![("add".to_string(), "{\"a\":1}".to_string())]);
            // No calls: every byte is content, "<tool" held back until it is known not to start one.
            let (content, calls) = stream("a <tool_calls are fun <tool", cut);
            assert_eq!((content.as_str(), calls.len()), ("a <tool_calls are fun <tool", 0));
        }
    }

    #[test]
    fn llama3_calls_stream_as_they_are_written() {
        let f = ToolCallFormat::Llama3Json;
        let forced = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa;ris\\\"\"}}; {\"name\": \"add\", \"parameters\": {\"a\": [1, {\"b\": \"日本\"}]}}";
        let tagged = "<|python_tag|>{\"parameters\": {\"a\": 1}, \"name\": \"add\"}";
        for cut in [1, 2, 3, 7, 1000] {
            let (content, calls) = stream_in(f, forced, cut);
            assert_eq!(content, "");
            assert_eq!(calls.len(), 2, "cut {cut}");
            let args: Value = serde_json::from_str(&calls[0].1).unwrap();
            assert_eq!(args["city"], "Pa;ris\"");
            assert_eq!(serde_json::from_str::<Value>(&calls[1].1).unwrap()["a"][1]["b"], "日本");
            // Another key order after the tag: sent whole at the end, the tag not as content.
            let (content, calls) = stream_in(f, tagged, cut);
            assert_eq!(content, "");
            assert_eq!(calls, vec![("add".to_string(), "{\"a\":1}".to_string())]);
            // An answer that is not a call is content, every byte of it.
            let text = "  <|py is not a tag; {\"name\": \"add\"}";
            assert_eq!(stream_in(f, text, cut), (text.to_string(), vec![]));
            let text = "{\"answer\": 42}";
            assert_eq!(stream_in(f, text, cut), (text.to_string(), vec![]));
        }
    }
}
