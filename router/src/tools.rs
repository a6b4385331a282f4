//! Tool calling: the request's `tools`, `tool_choice` and `parallel_tool_calls`, the history's
//! assistant `tool_calls` and `tool` messages laid out for the model, and the model's output
//! read back into OpenAI's `tool_calls`, whole or as streamed deltas.
//!
//! Calls are written in one of the formats of [`crate::tool_format`] (Hermes' `<tool_call>`
//! blocks unless the template or `--tool-call-parser` says Llama 3 JSON). A chat template that
//! reads `tools` lays the definitions and past calls out itself; for one that does not (the
//! default model's), a system message describes the tools and the format, past calls are
//! written in the format in the assistant turn, and tool results as `<tool_response>` blocks in
//! a user turn. `tool_choice` `required` and a named function are
//! enforced by a grammar (each call's arguments follow the function's JSON schema), `auto`
//! leaves the choice to the model and reads calls out of whatever it wrote, `none` leaves the
//! tools out of the prompt.

use std::hash::{BuildHasher, Hasher};

use serde::Deserialize;
use serde_json::{json, Value};
use tandem_engine::sampling::structured::StructuredOutput;
use tandem_engine::ChatMessage;

use crate::error::ApiError;
use crate::tool_format::{ParsedCall, ToolCallFormat};

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolIn {
    /// Must be `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionIn,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionIn {
    /// Its name (`[A-Za-z0-9_-]{1,64}`).
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON schema of its arguments (an object schema; none: no arguments).
    pub parameters: Option<Value>,
    /// OpenAI's strict mode: arguments always follow the schema when the call is forced.
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or one named function.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceIn {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named {
        /// Must be `function`.
        #[serde(rename = "type")]
        kind: String,
        /// The function to call.
        function: NamedFunction,
    },
}

/// The function of a named `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    /// Its name.
    pub name: String,
}

/// A call in an assistant message of the history.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    /// The call's id (answered by a `tool` message's `tool_call_id`).
    pub id: Option<String>,
    /// Must be `function` when given.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The function and its arguments.
    pub function: FunctionCallIn,
}

/// The function of a past call.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON text.
    pub arguments: String,
}

/// How the model may use the tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Never (the tools are left out of the prompt).
    None,
    /// As it sees fit.
    Auto,
    /// At least one call.
    Required,
    /// A call to this function.
    Named(String),
}

/// A request's tools.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The functions, as given.
    pub functions: Vec<FunctionIn>,
    /// The choice.
    pub choice: ToolChoice,
    /// Several calls in one turn.
    pub parallel: bool,
    /// How calls are written.
    pub format: ToolCallFormat,
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Tools {
    /// Reads and checks the tool fields: a bad definition or choice is a 400 naming it. None when
    /// the request has no tools. Calls are written in `format`.
    pub fn from_request(
        tools: Option<&[ToolIn]>,
        choice: Option<&ToolChoiceIn>,
        parallel: Option<bool>,
        format: ToolCallFormat,
    ) -> Result<Option<Tools>, ApiError> {
        let tools = tools.unwrap_or_default();
        let choice = match choice {
            None => ToolChoice::Auto,
            Some(ToolChoiceIn::Mode(m)) => match m.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        Some("tool_choice"),
                        format!("tool_choice must be none, auto, required or a named function, got '{other}'"),
                    ))
                }
            },
            Some(ToolChoiceIn::Named { kind, function }) => {
                if kind != "function" {
                    return Err(ApiError::invalid(
                        Some("tool_choice.type"),
                        format!("tool_choice type must be 'function', got '{kind}'"),
                    ));
                }
                ToolChoice::Named(function.name.clone())
            }
        };
        if tools.is_empty() {
            return match choice {
                ToolChoice::Required | ToolChoice::Named(_) => Err(ApiError::invalid(
                    Some("tool_choice"),
                    "tool_choice requires tools to call; none were given",
                )),
                _ => Ok(None),
            };
        }
        let mut functions: Vec<FunctionIn> = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            if t.kind != "function" {
                return Err(ApiError::invalid(
                    Some(&format!("tools[{i}].type")),
                    format!("tools must be of type 'function', got '{}'", t.kind),
                ));
            }
            let f = &t.function;
            if !valid_name(&f.name) {
                return Err(ApiError::invalid(
                    Some(&format!("tools[{i}].function.name")),
                    format!(
                        "function names are 1 to 64 letters, digits, '_' or '-', got '{}'",
                        f.name
                    ),
                ));
            }
            if functions.iter().any(|g| g.name == f.name) {
                return Err(ApiError::invalid(
                    Some(&format!("tools[{i}].function.name")),
                    format!("two tools are named '{}'", f.name),
                ));
            }
            if let Some(p) = &f.parameters {
                if !p.is_object() || p.get("type").is_some_and(|t| t != "object") {
                    return Err(ApiError::invalid(
                        Some(&format!("tools[{i}].function.parameters")),
                        "a function's parameters must be a JSON schema of type 'object'",
                    ));
                }
            }
            functions.push(f.clone());
        }
        if let ToolChoice::Named(n) = &choice {
            if !functions.iter().any(|f| f.name == *n) {
                return Err(ApiError::invalid(
                    Some("tool_choice.function.name"),
                    format!("tool_choice names '{n}', which is not among the tools"),
                ));
            }
        }
        Ok(Some(Tools { functions, choice, parallel: parallel.unwrap_or(true), format }))
    }

    /// Whether the output is read for calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools as OpenAI writes them (a template's `tools` variable).
    pub fn as_value(&self) -> Value {
        Value::Array(
            self.functions
                .iter()
                .map(|f| {
                    let mut func = json!({ "name": f.name, "parameters": parameters(f) });
                    if let Some(d) = &f.description {
                        func["description"] = json!(d);
                    }
                    json!({ "type": "function", "function": func })
                })
                .collect(),
        )
    }

    /// The grammar that forces the calls (`required`, or a named function): one or (parallel)
    /// more calls whose objects follow the functions' schemas. None for `auto` / `none`.
    pub fn constraint(&self) -> Option<StructuredOutput> {
        let allowed: Vec<&FunctionIn> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.functions.iter().collect(),
            ToolChoice::Named(n) => self.functions.iter().filter(|f| f.name == *n).collect(),
        };
        let schemas: Vec<Value> = allowed
            .iter()
            .map(|f| with_layout(self.format.call_schema(&f.name, parameters(f))))
            .collect();
        Some(StructuredOutput::Grammar(self.format.grammar(&schemas, self.parallel)))
    }

    /// The system text that describes the tools to a model whose template does not.
    pub fn system_prompt(&self) -> String {
        let mut s = String::from(
            "You may call one or more functions to help with the user's request. The functions are described in JSON schema inside <tools></tools>:\n<tools>\n",
        );
        for t in self.as_value().as_array().into_iter().flatten() {
            s.push_str(&t.to_string());
            s.push('\n');
        }
        s.push_str("</tools>\n");
        s.push_str(self.format.instructions());
        s
    }
}

/// A function's parameters schema (none: an object with no properties).
fn parameters(f: &FunctionIn) -> Value {
    f.parameters.clone().unwrap_or_else(|| json!({ "type": "object", "properties": {} }))
}

/// Calls written the way the grammar and the fallback prompt show them: on one line, with a
/// space after `:` and `,`; numbers end after a bounded count of decimals, as in JSON-schema
/// outputs.
fn with_layout(mut v: Value) -> Value {
    tandem_engine::sampling::structured::bound_fraction_digits(&mut v);
    v["x-guidance"] =
        json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " });
    v
}

/// Lays the conversation out for the template. A template that reads `tools` gets the calls and
/// results as structured messages; otherwise the tools become a system message (merged into
/// the first one, if any), past calls written in `format` and results `<tool_response>` user
/// turns.
pub fn lay_out(
    messages: Vec<ChatMessage>,
    tools: Option<&Tools>,
    native: bool,
    format: ToolCallFormat,
) -> Vec<ChatMessage> {
    if native {
        return messages;
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if let Some(t) = tools.filter(|t| t.active()) {
        let prompt = t.system_prompt();
        match messages.first() {
            Some(m) if m.role == "system" => {
                out.push(ChatMessage::new("system", &format!("{}\n\n{prompt}", m.content)))
            }
            _ => out.push(ChatMessage::new("system", &prompt)),
        }
    }
    let skip_first = out.len() == 1 && messages.first().is_some_and(|m| m.role == "system");
    for m in messages.into_iter().skip(usize::from(skip_first)) {
        match m.role.as_str() {
            "tool" => {
                let text = format!("<tool_response>\n{}\n</tool_response>", m.content);
                // Consecutive results share one user turn.
                match out.last_mut() {
                    Some(last)
                        if last.role == "user" && last.content.ends_with("</tool_response>") =>
                    {
                        last.content.push('\n');
                        last.content.push_str(&text);
                    }
                    _ => out.push(ChatMessage::new("user", &text)),
                }
            }
            "assistant" if m.tool_calls.is_some() => {
                let calls = m.tool_calls.iter().flat_map(|c| c.as_array().into_iter().flatten());
                let calls = format.calls_text(calls.map(|c| {
                    (c["function"]["name"].as_str().unwrap_or(""), &c["function"]["arguments"])
                }));
                let text = match m.content.is_empty() {
                    true => calls,
                    false => format!("{}\n{calls}", m.content),
                };
                out.push(ChatMessage::new("assistant", &text));
            }
            _ => out.push(ChatMessage { tool_calls: None, tool_call_id: None, ..m }),
        }
    }
    out
}

/// The history's calls as templates read them (arguments parsed into objects); a call whose
/// arguments are not a JSON object is a 400 naming it.
pub fn history_calls(i: usize, calls: &[ToolCallIn]) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let param = format!("messages[{i}].tool_calls[{j}]");
        if c.kind.as_deref().is_some_and(|k| k != "function") {
            return Err(ApiError::invalid(
                Some(&format!("{param}.type")),
                "tool calls are of type 'function'",
            ));
        }
        let args: Value = serde_json::from_str(&c.function.arguments)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| {
                ApiError::invalid(
                    Some(&format!("{param}.function.arguments")),
                    "a tool call's arguments must be a JSON object, as text",
                )
            })?;
        out.push(json!({
            "id": c.id,
            "type": "function",
            "function": { "name": c.function.name, "arguments": args },
        }));
    }
    Ok(Value::Array(out))
}

/// A fresh call id (`call_` and 24 hex digits).
pub fn call_id() -> String {
    let a = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let b = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("call_{:016x}{:08x}", a, b as u32)
}

/// An assistant message with calls: OpenAI's `message` object and finish reason.
pub fn message_with_calls(content: Option<String>, calls: &[ParsedCall]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({ "id": call_id(), "type": "function", "function": { "name": c.name, "arguments": c.arguments } })
        })
        .collect();
    json!({ "role": "assistant", "content": content, "tool_calls": calls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_definitions_and_choices_are_checked() {
        let tool = |name: &str, params: Value| -> ToolIn {
            serde_json::from_value(
                json!({"type": "function", "function": {"name": name, "parameters": params}}),
            )
            .unwrap()
        };
        let ok = [tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )];
        let named = |n: &str| -> ToolChoiceIn {
            serde_json::from_value(json!({"type": "function", "function": {"name": n}})).unwrap()
        };
        let mode = |m: &str| ToolChoiceIn::Mode(m.into());
        let cases: Vec<(Vec<ToolIn>, Option<ToolChoiceIn>, &str)> = vec![
            (vec![tool("bad name!", json!({}))], None, "tools[0].function.name"),
            (vec![tool("f", json!({"type": "array"}))], None, "tools[0].function.parameters"),
            (vec![tool("f", json!({})), tool("f", json!({}))], None, "tools[1].function.name"),
            (ok.to_vec(), Some(named("other")), "tool_choice.function.name"),
            (ok.to_vec(), Some(mode("sometimes")), "tool_choice"),
            (vec![], Some(mode("required")), "tool_choice"),
        ];
        for (tools, choice, param) in cases {
            let e =
                Tools::from_request(Some(&tools), choice.as_ref(), None, ToolCallFormat::Hermes)
                    .unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        }
        let t = Tools::from_request(
            Some(&ok),
            Some(&mode("required")),
            Some(false),
            ToolCallFormat::Hermes,
        )
        .unwrap()
        .unwrap();
        let Some(StructuredOutput::Grammar(g)) = t.constraint() else { panic!() };
        assert!(g.starts_with("start: call\n") && g.contains("%json {"), "{g}");
        // A number argument ends after a bounded count of decimals, as in schema outputs.
        let priced = [tool(
            "buy",
            json!({"type": "object", "properties": {"price": {"type": "number", "maximum": 10}}}),
        )];
        let t = Tools::from_request(
            Some(&priced),
            Some(&mode("required")),
            None,
            ToolCallFormat::Hermes,
        )
        .unwrap()
        .unwrap();
        let Some(StructuredOutput::Grammar(g)) = t.constraint() else { panic!() };
        assert!(g.contains("\"multipleOf\":1e-8"), "{g}");
        assert!(Tools::from_request(Some(&ok), None, None, ToolCallFormat::Hermes)
            .unwrap()
            .unwrap()
            .constraint()
            .is_none());
    }

    #[test]
    fn history_without_a_tools_template_is_written_out() {
        let t = Tools::from_request(
            Some(&[serde_json::from_value(
                json!({"type": "function", "function": {"name": "add"}}),
            )
            .unwrap()]),
            None,
            None,
            ToolCallFormat::Hermes,
        )
        .unwrap();
        let calls = history_calls(1, &[serde_json::from_value(json!({"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}})).unwrap()]).unwrap();
        let msgs = vec![
            ChatMessage::new("user", "1 + 2?"),
            ChatMessage { tool_calls: Some(calls), ..ChatMessage::new("assistant", "") },
            ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "3") },
        ];
        let out = lay_out(msgs.clone(), t.as_ref(), false, ToolCallFormat::Hermes);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.contains("\"name\":\"add\""));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call>"
        );
        assert_eq!(out[3].content, "<tool_response>\n3\n</tool_response>");
        let out = lay_out(msgs, t.as_ref(), false, ToolCallFormat::Llama3Json);
        assert_eq!(out[2].content, "{\"name\": \"add\", \"parameters\": {\"a\":1}}");
        let bad = history_calls(
            4,
            &[serde_json::from_value(json!({"function": {"name": "add", "arguments": "[1]"}}))
                .unwrap()],
        );
        assert_eq!(
            bad.unwrap_err().param.as_deref(),
            Some("messages[4].tool_calls[0].function.arguments")
        );
    }

    #[test]
    fn a_template_that_reads_tools_lays_them_out_itself() {
        let src = include_str!("../../tests/e2e/chatml_tools.jinja");
        let t = tandem_engine::ChatTemplate::new(src, "", "<|im_end|>").unwrap();
        assert!(t.reads_tools());
        let tools = Tools::from_request(
            Some(&[serde_json::from_value(json!({"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}})).unwrap()]),
            None,
            None,
            ToolCallFormat::Hermes,
        )
        .unwrap()
        .unwrap();
        let calls = history_calls(
            1,
            &[serde_json::from_value(
                json!({"id": "c1", "function": {"name": "add", "arguments": "{\"a\": 1}"}}),
            )
            .unwrap()],
        )
        .unwrap();
        let msgs = vec![
            ChatMessage::new("user", "1 + 2?"),
            ChatMessage { tool_calls: Some(calls), ..ChatMessage::new("assistant", "") },
            ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "3") },
        ];
        let msgs = lay_out(msgs, Some(&tools), true, ToolCallFormat::Hermes);
        let text = t.render_with_tools(&msgs, Some(&tools.as_value()), true).unwrap();
        let want = "<|im_start|>system\nYou are a function calling assistant.";
        assert!(text.starts_with(want), "{text}");
        assert!(text.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\"}}}\n</tools>"), "{text}");
        assert!(text.contains("<|im_start|>user\n1 + 2?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{text}");
    }
}
