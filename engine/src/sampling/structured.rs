//! Structured outputs: a request's output held to a JSON schema, a regular expression, a list of
//! choices or a grammar, by masking every token that cannot continue it before sampling.
//!
//! The constraint engine is `llguidance` (an Earley parser over derivative-based lexers that
//! walks the vocabulary as a byte trie). [`GrammarCompiler`] builds that trie once from the
//! model's tokenizer and compiles constraints into [`GrammarMatcher`]s, one per sequence; the
//! engine asks a matcher for the allowed tokens before each sample and feeds it each token
//! appended. Compiled constraints are cached, so a schema sent with every request is compiled
//! once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde::{Deserialize, Serialize};

use crate::model_files::tokenizer::Tokenizer;

/// What a request's output must follow (vLLM's `structured_outputs` kinds; OpenAI's
/// `response_format` maps onto `Json` and `JsonObject`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// JSON valid under this JSON schema.
    Json(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax, anchored at both ends).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text in the language of this grammar: llguidance's Lark syntax (it may embed JSON
    /// schemas with `%json { ... }`), or llama.cpp's GBNF (rules written `name ::= …`,
    /// translated by [`super::gbnf`]).
    Grammar(String),
}

/// Compiled constraints kept for reuse.
const CACHE_ENTRIES: usize = 64;

impl StructuredOutput {
    /// The constraint as llguidance's grammar description.
    fn grammar(&self) -> Result<TopLevelGrammar, StructuredError> {
        Ok(match self {
            StructuredOutput::Json(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(StructuredError::Invalid(
                        "a JSON schema must be a JSON object".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            StructuredOutput::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            StructuredOutput::Regex(rx) => TopLevelGrammar::from_regex(rx),
            StructuredOutput::Choice(choices) => {
                if choices.is_empty() {
                    return Err(StructuredError::Invalid(
                        "choice needs at least one string".into(),
                    ));
                }
                // Lark string literals take JSON's escapes.
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("a string serialises"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            StructuredOutput::Grammar(g) => {
                if g.trim().is_empty() {
                    return Err(StructuredError::Invalid("the grammar is empty".into()));
                }
                if super::gbnf::is_gbnf(g) {
                    let lark = super::gbnf::to_lark(g)
                        .map_err(|e| StructuredError::Invalid(e.to_string()))?;
                    TopLevelGrammar::from_lark(lark)
                } else {
                    TopLevelGrammar::from_lark(g.clone())
                }
            }
        })
    }

    /// The cache key: the constraint as canonical JSON.
    fn key(&self) -> String {
        serde_json::to_string(self).expect("a constraint serialises")
    }
}

/// JSON laid out on one line as `{"a": 1, "b": [2, 3]}`, unless the schema says otherwise with
/// llguidance's `x-guidance` options: free whitespace lets a small model pad its output with
/// newlines until it runs out of tokens. Numbers get at most [`FRACTION_DIGITS`] digits after
/// the point ([`bound_fraction_digits`]).
fn with_layout(mut schema: serde_json::Value) -> serde_json::Value {
    bound_fraction_digits(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Most digits after the decimal point of a JSON-schema `number` whose schema sets no
/// `multipleOf`. Unbounded, a small model at temperature 0 can write a number at its schema's
/// `maximum` as `10.000…` until `max_tokens` (only zeros may follow there). llguidance counts
/// the digits of a `multipleOf: 1e-k` (up to k = 8; larger k overflows its decimal arithmetic).
pub const FRACTION_DIGITS: i32 = 8;

/// Gives every `"type": "number"` subschema without a `multipleOf` one of `10^-FRACTION_DIGITS`:
/// the numbers it allows are a subset of the schema's, with at most [`FRACTION_DIGITS`]
/// decimals (and no exponent). Only schema positions are visited (never `const`, `enum`,
/// `default` or `examples` data).
pub fn bound_fraction_digits(schema: &mut serde_json::Value) {
    use serde_json::Value;
    let Some(o) = schema.as_object_mut() else { return };
    let is_number = match o.get("type") {
        Some(Value::String(t)) => t == "number",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "number"),
        _ => false,
    };
    if is_number && !o.contains_key("multipleOf") {
        o.insert("multipleOf".into(), serde_json::json!(10f64.powi(-FRACTION_DIGITS)));
    }
    for (key, v) in o.iter_mut() {
        match key.as_str() {
            // One schema.
            "items"
            | "additionalProperties"
            | "additionalItems"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems" => match v {
                Value::Array(a) => a.iter_mut().for_each(bound_fraction_digits),
                v => bound_fraction_digits(v),
            },
            // A list of schemas.
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                v.as_array_mut().into_iter().flatten().for_each(bound_fraction_digits)
            }
            // Named schemas.
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => v
                .as_object_mut()
                .into_iter()
                .flat_map(|m| m.values_mut())
                .for_each(bound_fraction_digits),
            _ => {}
        }
    }
}

/// A constraint that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StructuredError {
    /// The schema, expression or grammar does not compile (llguidance's message).
    #[error("{0}")]
    Invalid(String),
    /// The model was loaded without a vocabulary.
    #[error("structured outputs need the model's tokenizer; this model serves token ids only")]
    NoVocabulary,
}

/// The vocabulary as llguidance sees it: the token trie, and a tokenizer for the bytes it asks
/// to have tokenized (greedy over the trie; used only for forced-token hints).
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// Compiles constraints for one model's vocabulary (built once per process, on first use: the
/// trie of a 262k-token vocabulary takes a moment).
pub struct GrammarCompiler {
    factory: ParserFactory,
    eos: Arc<[u32]>,
    vocab: usize,
    cache: Mutex<VecDeque<(String, TokenParser)>>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").field("eos", &self.eos).finish()
    }
}

impl GrammarCompiler {
    /// Builds the vocabulary trie of `tok`, sized to the model's `vocab_size` (logit rows may
    /// be longer than the tokenizer's vocabulary; the extra ids are never allowed).
    pub fn new(tok: &Tokenizer, vocab_size: usize) -> Result<Self, StructuredError> {
        if tok.is_ids_only() || tok.eos_token_ids.is_empty() {
            return Err(StructuredError::NoVocabulary);
        }
        let mut words = tok.token_bytes();
        words.resize(vocab_size.max(words.len()), Vec::new());
        for (id, w) in words.iter_mut().enumerate() {
            if tok.is_special(id as u32) {
                // llguidance's spelling of a special token: a marker byte, then its name.
                let name = tok.id_to_token(id as u32).unwrap_or_default();
                *w = [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat();
            }
        }
        let eos: Arc<[u32]> = tok.eos_token_ids.clone().into();
        let info = TokRxInfo::new(words.len() as u32, eos[0]);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(VocabEnv { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| StructuredError::Invalid(e.to_string()))?;
        factory.quiet();
        let vocab = words.len();
        Ok(GrammarCompiler { factory, eos, vocab, cache: Mutex::new(VecDeque::new()) })
    }

    /// A matcher at the start of `constraint`'s language.
    pub fn compile(
        &self,
        constraint: &StructuredOutput,
    ) -> Result<GrammarMatcher, StructuredError> {
        let key = constraint.key();
        let cached = {
            let cache = self.cache.lock().expect("grammar cache lock");
            cache.iter().find(|(k, _)| *k == key).map(|(_, p)| p.deep_clone())
        };
        let parser = match cached {
            Some(p) => p,
            None => {
                let grammar = constraint.grammar()?;
                let parser = self
                    .factory
                    .create_parser(grammar)
                    .map_err(|e| StructuredError::Invalid(first_line(&e.to_string())))?;
                let mut cache = self.cache.lock().expect("grammar cache lock");
                if cache.len() == CACHE_ENTRIES {
                    cache.pop_front();
                }
                cache.push_back((key, parser.deep_clone()));
                parser
            }
        };
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(StructuredError::Invalid(first_line(&e)));
        }
        Ok(GrammarMatcher {
            matcher,
            eos: self.eos.clone(),
            vocab: self.vocab,
            cached: None,
            ahead: None,
        })
    }
}

/// llguidance's errors can carry the whole grammar after the first line.
fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or(e).trim().to_string()
}

/// One sequence's position in its constraint's language.
pub struct GrammarMatcher {
    matcher: Matcher,
    eos: Arc<[u32]>,
    vocab: usize,
    /// The allowed tokens at this position, once computed (until the next token).
    cached: Option<SimpleVob>,
    /// A token taken ahead of [`GrammarMatcher::accept`] ([`GrammarMatcher::accept_ahead`]).
    ahead: Option<(u32, Result<(), StructuredError>)>,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher").field("complete", &self.is_complete()).finish()
    }
}

impl GrammarMatcher {
    /// The tokens that may come next: those that continue the language and, where the text so
    /// far is complete, every end-of-sequence token. A matcher in error allows only those.
    pub fn allowed(&mut self) -> SimpleVob {
        if let Some(m) = &self.cached {
            return m.clone();
        }
        let mut mask = match self.matcher.compute_mask() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %first_line(&e.to_string()), "constraint failed; ending the output");
                SimpleVob::alloc(self.vocab)
            }
        };
        let accepting = self.eos.iter().any(|&t| mask.is_allowed(t)) || self.matcher.is_error();
        if accepting {
            for &t in self.eos.iter() {
                if (t as usize) < mask.len() {
                    mask.allow_token(t);
                }
            }
        }
        self.cached = Some(mask.clone());
        mask
    }

    /// [`GrammarMatcher::allowed`] as bits: bit `i % 32` of word `i / 32` is token `i` (what a
    /// device sampler takes).
    pub fn allowed_bits(&mut self) -> Vec<u32> {
        self.allowed().as_slice().to_vec()
    }

    /// Sets every logit the constraint rules out to minus infinity.
    pub fn mask_logits(&mut self, logits: &mut [f32]) {
        let mask = self.allowed();
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= mask.len() || !mask.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Moves past a generated token (end-of-sequence tokens end the output and are not fed).
    pub fn accept(&mut self, token: u32) -> Result<(), StructuredError> {
        if let Some((t, result)) = self.ahead.take() {
            if t == token {
                return result;
            }
            debug_assert!(false, "token {token} offered after {t} was taken ahead");
        }
        if self.eos.contains(&token) {
            return Ok(());
        }
        self.cached = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| StructuredError::Invalid(first_line(&e.to_string())))
    }

    /// Takes `token` now (off the step's critical path, for many sequences at once); the next
    /// [`GrammarMatcher::accept`] of the same token returns the result.
    pub fn accept_ahead(&mut self, token: u32) {
        let result = self.accept(token);
        self.ahead = Some((token, result));
    }

    /// Whether the output is complete and nothing may follow (the sequence stops here).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// An independent copy at the same position (for another completion of the request).
    pub fn fork(&self) -> Self {
        GrammarMatcher {
            matcher: self.matcher.deep_clone(),
            eos: self.eos.clone(),
            vocab: self.vocab,
            cached: self.cached.clone(),
            ahead: self.ahead.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_a_digit_bound_and_data_is_left_alone() {
        let mut s = serde_json::json!({
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "b": {"type": ["number", "null"], "multipleOf": 0.5},
                "c": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                "d": {"anyOf": [{"type": "number", "maximum": 3}, {"type": "string"}]},
                "e": {"const": {"type": "number"}, "enum": [{"type": "number"}]},
                "f": {"type": "integer"},
            },
            "$defs": {"n": {"type": "number"}},
        });
        bound_fraction_digits(&mut s);
        let bound = serde_json::json!(1e-8);
        assert_eq!(s["properties"]["a"]["multipleOf"], bound);
        assert_eq!(s["properties"]["b"]["multipleOf"], 0.5);
        assert_eq!(s["$defs"]["n"]["multipleOf"], bound);
        assert_eq!(s["properties"]["d"]["anyOf"][0]["multipleOf"], bound);
        assert_eq!(s["properties"]["e"]["const"], serde_json::json!({"type": "number"}));
        assert_eq!(s["properties"]["e"]["enum"][0], serde_json::json!({"type": "number"}));
        assert!(s["properties"]["f"].get("multipleOf").is_none());
        assert!(s.get("multipleOf").is_none());
    }
}
