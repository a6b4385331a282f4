//! The request fields that ask for structured output — OpenAI's `response_format`, vLLM's
//! `structured_outputs` and its older `guided_*` fields — read into the engine's one
//! [`StructuredOutput`], and compiled once here so that a schema or grammar that cannot be used
//! is a 400 before any worker is involved.

use serde::Deserialize;
use serde_json::Value;
use tandem_engine::sampling::structured::{GrammarCompiler, StructuredError, StructuredOutput};

use crate::error::ApiError;

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (required by OpenAI; informative here).
    pub name: Option<String>,
    /// What the schema is for (informative).
    pub description: Option<String>,
    /// The JSON schema.
    pub schema: Option<Value>,
    /// OpenAI's strict mode: the output always follows the schema here, strict or not.
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of these.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredOutputsParams {
    /// A JSON schema (an object, or a string holding one).
    pub json: Option<Value>,
    /// A regular expression.
    pub regex: Option<String>,
    /// A list of strings.
    pub choice: Option<Vec<String>>,
    /// A grammar: Lark (llguidance's dialect) or GBNF (llama.cpp's).
    pub grammar: Option<String>,
    /// Any JSON object.
    pub json_object: Option<bool>,
}

/// The structured-output fields of a request body (flattened into the shared parameters).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredFields {
    /// OpenAI's `response_format`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs`.
    pub structured_outputs: Option<StructuredOutputsParams>,
    /// vLLM (older): a JSON schema.
    pub guided_json: Option<Value>,
    /// vLLM (older): a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM (older): a list of strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (older): a grammar.
    pub guided_grammar: Option<String>,
    /// llama-server: a GBNF (or Lark) grammar.
    pub grammar: Option<String>,
    /// llama-server: a JSON schema.
    pub json_schema: Option<Value>,
}

/// A schema given as an object, or as a string holding one (vLLM accepts both).
fn schema(param: &str, v: &Value) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid(Some(param), format!("{param} is not a JSON schema: {e}"))
        })?,
        v => v.clone(),
    };
    if !v.is_object() && !v.is_boolean() {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param} must be a JSON schema object"),
        ));
    }
    Ok(v)
}

impl StructuredFields {
    /// The one constraint the request asks for, with the field that asked for it; two fields
    /// asking at once are refused (the second is named).
    pub fn constraint(&self) -> Result<Option<(String, StructuredOutput)>, ApiError> {
        let mut found: Vec<(String, StructuredOutput)> = Vec::new();
        match &self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject) => {
                found.push(("response_format".into(), StructuredOutput::JsonObject))
            }
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                let param = "response_format.json_schema.schema";
                let s = json_schema.schema.as_ref().ok_or_else(|| {
                    ApiError::invalid(Some(param), "response_format json_schema needs a schema")
                })?;
                found.push((param.into(), StructuredOutput::Json(schema(param, s)?)));
            }
        }
        if let Some(so) = &self.structured_outputs {
            let p = |k: &str| format!("structured_outputs.{k}");
            if let Some(j) = &so.json {
                found.push((p("json"), StructuredOutput::Json(schema(&p("json"), j)?)));
            }
            if let Some(r) = &so.regex {
                found.push((p("regex"), StructuredOutput::Regex(r.clone())));
            }
            if let Some(c) = &so.choice {
                found.push((p("choice"), StructuredOutput::Choice(c.clone())));
            }
            if let Some(g) = &so.grammar {
                found.push((p("grammar"), StructuredOutput::Grammar(g.clone())));
            }
            if so.json_object == Some(true) {
                found.push((p("json_object"), StructuredOutput::JsonObject));
            }
        }
        if let Some(j) = &self.guided_json {
            found.push(("guided_json".into(), StructuredOutput::Json(schema("guided_json", j)?)));
        }
        if let Some(r) = &self.guided_regex {
            found.push(("guided_regex".into(), StructuredOutput::Regex(r.clone())));
        }
        if let Some(c) = &self.guided_choice {
            found.push(("guided_choice".into(), StructuredOutput::Choice(c.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar".into(), StructuredOutput::Grammar(g.clone())));
        }
        if let Some(g) = &self.grammar {
            found.push(("grammar".into(), StructuredOutput::Grammar(g.clone())));
        }
        if let Some(j) = &self.json_schema {
            found.push(("json_schema".into(), StructuredOutput::Json(schema("json_schema", j)?)));
        }
        if found.len() > 1 {
            return Err(ApiError::invalid(
                Some(&found[1].0),
                format!(
                    "only one structured output constraint may be given; got {} and {}",
                    found[0].0, found[1].0
                ),
            ));
        }
        Ok(found.pop())
    }
}

/// Compiles `c` (cached by the compiler) and answers a 400 naming `param` when it cannot be
/// used.
pub fn check(
    compiler: Result<&GrammarCompiler, &StructuredError>,
    param: &str,
    c: &StructuredOutput,
) -> Result<(), ApiError> {
    let refuse = |e: &StructuredError| {
        ApiError::invalid(Some(param), format!("{param} cannot be used: {e}"))
    };
    compiler.map_err(refuse)?.compile(c).map(|_| ()).map_err(|e| refuse(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: Value) -> StructuredFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_field_maps_to_one_constraint() {
        let schema =
            serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (serde_json::json!({"response_format": {"type": "text"}}), None),
            (
                serde_json::json!({"response_format": {"type": "json_object"}}),
                Some(StructuredOutput::JsonObject),
            ),
            (
                serde_json::json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Some(StructuredOutput::Json(schema.clone())),
            ),
            (
                serde_json::json!({"structured_outputs": {"json": schema.to_string()}}),
                Some(StructuredOutput::Json(schema.clone())),
            ),
            (
                serde_json::json!({"structured_outputs": {"choice": ["a", "b"]}}),
                Some(StructuredOutput::Choice(vec!["a".into(), "b".into()])),
            ),
            (
                serde_json::json!({"guided_regex": "[a-z]+"}),
                Some(StructuredOutput::Regex("[a-z]+".into())),
            ),
            (
                serde_json::json!({"guided_grammar": "start: \"x\""}),
                Some(StructuredOutput::Grammar("start: \"x\"".into())),
            ),
            (
                serde_json::json!({"grammar": "root ::= \"x\""}),
                Some(StructuredOutput::Grammar("root ::= \"x\"".into())),
            ),
            (
                serde_json::json!({"json_schema": schema}),
                Some(StructuredOutput::Json(schema.clone())),
            ),
        ];
        for (v, want) in cases {
            let got = fields(v.clone()).constraint().unwrap().map(|(_, c)| c);
            assert_eq!(got, want, "{v}");
        }
    }

    #[test]
    fn two_constraints_or_a_schema_that_is_not_one_are_refused() {
        let e = fields(serde_json::json!({
            "response_format": {"type": "json_object"}, "guided_choice": ["a"]
        }))
        .constraint()
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_choice"));
        let e = fields(serde_json::json!({"guided_json": "{nope"})).constraint().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_json"));
        let e = fields(serde_json::json!({"guided_json": [1]})).constraint().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_json"));
        let e = fields(serde_json::json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}))
            .constraint()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format.json_schema.schema"));
        assert!(serde_json::from_value::<StructuredFields>(
            serde_json::json!({"response_format": {"type": "xml"}})
        )
        .is_err());
    }
}
