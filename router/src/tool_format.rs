//! The ways models write tool calls: how each is forced by a grammar, described to a model whose
//! template does not, written into a history, and read back out of an output.
//!
//! - [`ToolCallFormat::Hermes`] (Hermes, Qwen 2.5/3, SmolLM3 and others): each call a block
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, after any content.
//! - [`ToolCallFormat::Llama3Json`] (Llama 3.1–3.3 JSON tool calling): the whole answer is
//!   `{"name": "f", "parameters": {...}}`, optionally after `<|python_tag|>`, several calls
//!   separated by `; `. An answer that does not begin with `{` is content.
//!
//! The router takes the format from `--tool-call-parser`, or from the chat template (one that
//! writes `<|python_tag|>` or a `"parameters"` call object is Llama 3's; any other Hermes').

use serde_json::{json, Value};

/// A way of writing tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallFormat {
    /// `<tool_call>` blocks holding `{"name", "arguments"}`.
    #[default]
    Hermes,
    /// `{"name", "parameters"}` objects making up the whole answer, joined by `; `.
    Llama3Json,
}

impl std::str::FromStr for ToolCallFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ToolCallFormat::from_name(s)
            .ok_or_else(|| format!("unknown tool-call format '{s}' (hermes, llama3_json)"))
    }
}

/// Llama 3's marker before a call.
const PYTHON_TAG: &str = "<|python_tag|>";

/// A call read from the output.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// Function name.
    pub name: String,
    /// Arguments, as compact JSON text.
    pub arguments: String,
}

/// Where the calls of a (possibly unfinished) output begin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CallsStart {
    /// Content runs to `content`; the calls begin at `calls`.
    At {
        /// End of the content (the bytes from here to `calls` are markup).
        content: usize,
        /// Where the first call (or its block) begins.
        calls: usize,
    },
    /// No call has begun; the last `hold` bytes may still begin one.
    NotYet {
        /// Bytes held back from the content.
        hold: usize,
    },
}

impl ToolCallFormat {
    /// The format named `name` (`hermes`, `llama3_json`), as vLLM's `--tool-call-parser` names it.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" => Some(ToolCallFormat::Hermes),
            "llama3_json" => Some(ToolCallFormat::Llama3Json),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
        }
    }

    /// The format a chat template writes calls in.
    pub fn from_template(source: &str) -> Self {
        if source.contains("<tool_call>") {
            ToolCallFormat::Hermes
        } else if source.contains(PYTHON_TAG) || source.contains("\"parameters\"") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        }
    }

    /// The key holding a call's arguments.
    pub(crate) fn args_key(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "arguments",
            ToolCallFormat::Llama3Json => "parameters",
        }
    }

    /// What opens a call (Hermes' block tag; nothing for Llama 3).
    pub(crate) fn open(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "<tool_call>",
            ToolCallFormat::Llama3Json => "",
        }
    }

    /// What closes a call.
    pub(crate) fn close(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "</tool_call>",
            ToolCallFormat::Llama3Json => "",
        }
    }

    /// What stands between two calls besides whitespace.
    pub(crate) fn between(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "",
            ToolCallFormat::Llama3Json => ";",
        }
    }

    /// Between two calls as they are written.
    fn joiner(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "\n",
            ToolCallFormat::Llama3Json => "; ",
        }
    }

    /// One call as the model writes it.
    pub fn call_text(self, name: &str, arguments: &Value) -> String {
        let object = format!("{{\"name\": {}, \"{}\": {arguments}}}", json!(name), self.args_key());
        match self {
            ToolCallFormat::Hermes => format!("<tool_call>\n{object}\n</tool_call>"),
            ToolCallFormat::Llama3Json => object,
        }
    }

    /// Several calls as the model writes them.
    pub fn calls_text<'a>(self, calls: impl Iterator<Item = (&'a str, &'a Value)>) -> String {
        calls.map(|(n, a)| self.call_text(n, a)).collect::<Vec<_>>().join(self.joiner())
    }

    /// The JSON schema of one call object of the function `name`.
    pub fn call_schema(self, name: &str, parameters: Value) -> Value {
        json!({
            "type": "object",
            "properties": { "name": { "const": name }, self.args_key(): parameters },
            "required": ["name", self.args_key()],
            "additionalProperties": false,
        })
    }

    /// A Lark grammar of one (or, `parallel`, several) calls, each one of `schemas` (call
    /// objects, laid out as the grammar should write them).
    pub fn grammar(self, schemas: &[Value], parallel: bool) -> String {
        let joiner = serde_json::to_string(self.joiner()).expect("a string serialises");
        let mut g = if parallel {
            format!("start: call ({joiner} call)*\n")
        } else {
            "start: call\n".to_string()
        };
        let alts: Vec<String> = (0..schemas.len()).map(|i| format!("f{i}")).collect();
        match self {
            ToolCallFormat::Hermes => g.push_str(&format!(
                "call: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"\n",
                alts.join(" | ")
            )),
            ToolCallFormat::Llama3Json => g.push_str(&format!("call: {}\n", alts.join(" | "))),
        }
        for (i, s) in schemas.iter().enumerate() {
            g.push_str(&format!("f{i}: %json {s}\n"));
        }
        g
    }

    /// How to call, for the system message that describes tools to a model whose template
    /// does not.
    pub fn instructions(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "To call a function, answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>",
            ToolCallFormat::Llama3Json => "To call a function, answer with nothing but a JSON object holding its name and parameters, as {\"name\": \"function_name\", \"parameters\": {\"argument\": \"value\"}}; separate several calls with \"; \".",
        }
    }

    /// Where the calls begin in `text` (an output so far).
    pub(crate) fn calls_start(self, text: &str) -> CallsStart {
        match self {
            ToolCallFormat::Hermes => {
                let open = self.open();
                match text.find(open) {
                    Some(i) => CallsStart::At { content: i, calls: i },
                    None => CallsStart::NotYet {
                        hold: (1..open.len())
                            .rev()
                            .find(|&k| text.ends_with(&open[..k]))
                            .unwrap_or(0),
                    },
                }
            }
            ToolCallFormat::Llama3Json => {
                let lead = text.len() - text.trim_start().len();
                let rest = &text[lead..];
                let after_tag = rest.strip_prefix(PYTHON_TAG).map(str::trim_start);
                let body = after_tag.unwrap_or(rest);
                if body.starts_with('{') {
                    CallsStart::At { content: 0, calls: text.len() - body.len() }
                } else if body.is_empty() || (after_tag.is_none() && PYTHON_TAG.starts_with(rest)) {
                    // Blank, or what may still become the tag or a call: undecided.
                    CallsStart::NotYet { hold: text.len() }
                } else {
                    CallsStart::NotYet { hold: 0 }
                }
            }
        }
    }

    /// Reads the calls out of a whole output: the content before them (None when blank) and
    /// the calls. None when the output holds no well-formed call to one of `names` (it is then
    /// all content).
    pub fn parse_calls(
        self,
        text: &str,
        names: &[String],
    ) -> Option<(Option<String>, Vec<ParsedCall>)> {
        let CallsStart::At { content, calls: start } = self.calls_start(text) else {
            return None;
        };
        let mut calls = Vec::new();
        let mut rest = text[start..].trim_start();
        loop {
            rest = rest.strip_prefix(self.open())?.trim_start();
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let v = values.next()?.ok()?;
            let used = values.byte_offset();
            calls.push(call_from_value(v, names)?);
            rest = rest[used..].trim_start().strip_prefix(self.close())?.trim_start();
            if rest.is_empty() {
                break;
            }
            rest = rest.strip_prefix(self.between())?.trim_start();
            if rest.is_empty() {
                break;
            }
        }
        let content = text[..content].trim();
        Some(((!content.is_empty()).then(|| content.to_string()), calls))
    }
}

/// A call object (`name`, and `arguments` or `parameters`: an object, or a text holding one).
fn call_from_value(v: Value, names: &[String]) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    if !names.contains(&name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(json!({}));
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok().filter(Value::is_object)?,
        Value::Object(_) => args,
        _ => return None,
    };
    Some(ParsedCall { name, arguments: args.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "add".into()]
    }

    #[test]
    fn hermes_outputs_parse_into_calls_or_stay_content() {
        let f = ToolCallFormat::Hermes;
        let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>";
        let (content, calls) = f.parse_calls(t, &names()).unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(
            calls[0],
            ParsedCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }
        );
        assert_eq!(calls[1].arguments, "{\"a\":1}");
        for bad in [
            "no calls here",
            "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"argu",
            "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call> trailing",
        ] {
            assert!(f.parse_calls(bad, &names()).is_none(), "{bad}");
        }
    }

    #[test]
    fn llama3_outputs_parse_into_calls_or_stay_content() {
        let f = ToolCallFormat::Llama3Json;
        let t = " <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"add\", \"arguments\": {\"a\": 1}};";
        let (content, calls) = f.parse_calls(t, &names()).unwrap();
        assert_eq!(content, None);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{\"city\":\"Paris\"}");
        assert_eq!(calls[1], ParsedCall { name: "add".into(), arguments: "{\"a\":1}".into() });
        for bad in [
            "Paris is sunny. {\"name\": \"add\", \"parameters\": {}}",
            "{\"name\": \"rm_rf\", \"parameters\": {}}",
            "{\"name\": \"add\", \"parameters\": {}} and more",
            "{\"name\": \"add\", \"parameters\": {\"a\"",
            "{\"answer\": 42}",
        ] {
            assert!(f.parse_calls(bad, &names()).is_none(), "{bad}");
        }
        assert_eq!(f.calls_start("  <|pyth"), CallsStart::NotYet { hold: 8 });
        assert_eq!(f.calls_start("  "), CallsStart::NotYet { hold: 2 });
        assert_eq!(f.calls_start("Sure"), CallsStart::NotYet { hold: 0 });
        assert_eq!(f.calls_start("<|python_tag|> {"), CallsStart::At { content: 0, calls: 15 });
    }

    #[test]
    fn formats_are_told_from_templates_and_names() {
        let chatml = include_str!("../../tests/e2e/chatml_tools.jinja");
        let llama3 = include_str!("../../tests/e2e/llama3_tools.jinja");
        assert_eq!(ToolCallFormat::from_template(chatml), ToolCallFormat::Hermes);
        assert_eq!(ToolCallFormat::from_template(llama3), ToolCallFormat::Llama3Json);
        assert_eq!(ToolCallFormat::from_template("{{ messages }}"), ToolCallFormat::Hermes);
        for f in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json] {
            assert_eq!(ToolCallFormat::from_name(f.name()), Some(f));
            // What the format writes, it reads back.
            let args = json!({"a": 1});
            let text = f.calls_text([("add", &args), ("get_weather", &args)].into_iter());
            let (_, calls) = f.parse_calls(&text, &names()).unwrap();
            assert_eq!(calls.len(), 2, "{text}");
        }
        assert_eq!(ToolCallFormat::from_name("mistral"), None);
    }
}
