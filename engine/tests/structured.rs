//! Structured outputs on the real default model: every completion of a constrained request is
//! in its constraint's language (JSON schema, JSON object, regex, choice, Lark grammar), at
//! temperature 0 and 1, with n > 1 and next to unconstrained requests in the same batches;
//! constraints that do not compile are refused before anything is queued; a constrained request
//! never speculates and leaves no block behind.

use tandem_engine::sampling::structured::{GrammarCompiler, StructuredOutput};
use tandem_engine::speculative::spec_decode::SpeculativeConfig;
use tandem_engine::{
    model_files::model_fetch, EngineConfig, EngineError, FinishReason, KvCacheSize, LLMEngine,
    LoadOptions, Model, Prompt, SamplingParams,
};

fn engine(spec: Option<SpeculativeConfig>) -> LLMEngine {
    let opts = LoadOptions { kv_cache: KvCacheSize::Tokens(8192), ..Default::default() };
    let cfg = EngineConfig { speculative: spec, ..Default::default() };
    LLMEngine::new(Model::load(&model_fetch::default_model_path().unwrap(), opts).unwrap(), cfg)
}

fn chat(e: &LLMEngine, user: &str) -> Prompt {
    let t = e.chat_template.as_ref().expect("the default model has a chat template");
    let msgs = [tandem_engine::ChatMessage::new("user", user)];
    Prompt::Text(t.render(&msgs, true).unwrap())
}

fn params(s: StructuredOutput, temperature: f32, n: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        n,
        seed: Some(7),
        max_tokens: 200,
        structured: Some(s),
        ..Default::default()
    }
}

#[test]
fn constrained_outputs_are_in_their_language() {
    let mut e = engine(None);
    let person = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,10}$"}},
                "required": ["city"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "address"],
        "additionalProperties": false
    });
    let cases: Vec<(&str, StructuredOutput, &str)> = vec![
        ("json", StructuredOutput::Json(person.clone()), "Describe a person as JSON."),
        ("object", StructuredOutput::JsonObject, "Give me a JSON object about cats."),
        ("regex", StructuredOutput::Regex(r"[0-9]{3}-[0-9]{4}".into()), "A phone number?"),
        (
            "choice",
            StructuredOutput::Choice(vec!["Paris".into(), "Lyon".into(), "Nice \"city\"".into()]),
            "The capital of France?",
        ),
        (
            "grammar",
            StructuredOutput::Grammar(
                "start: \"The answer is \" NUM \".\"\nNUM: /[1-9][0-9]?/".into(),
            ),
            "What is 2 + 2?",
        ),
        ("gbnf", StructuredOutput::Grammar(GBNF_LIST.into()), "Write a short shopping list."),
    ];
    for temperature in [0.0, 1.0] {
        let mut ids = Vec::new();
        for (i, (name, s, user)) in cases.iter().enumerate() {
            let id = format!("{name}-{temperature}-{i}");
            let prompt = chat(&e, user);
            e.add_request(&id, prompt, params(s.clone(), temperature, 3), None).unwrap();
            ids.push((id, s.clone()));
        }
        // An unconstrained neighbour in the same batches.
        e.add_request("free", chat(&e, "Say hi."), SamplingParams::greedy(12), None).unwrap();
        let out = e.run_to_completion().unwrap();
        assert_eq!(out["free"][0].token_ids.len(), 12, "the neighbour is not constrained");
        for (id, s) in ids {
            let completions = &out[&id];
            assert_eq!(completions.len(), 3);
            for c in completions {
                if matches!(s, StructuredOutput::JsonObject)
                    && c.finish_reason == Some(FinishReason::Length)
                {
                    continue; // an object with no schema may go on for ever
                }
                assert_eq!(c.finish_reason, Some(FinishReason::Stop), "{id}: {:?}", c.text);
                assert!(accepted(&s, &c.text), "{id}: {:?} breaks {s:?}", c.text);
            }
        }
    }
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "every block came back");
}

/// llama.cpp's GBNF: a list of one to four items, each a count and a lower-case word.
const GBNF_LIST: &str = r#"# a shopping list
root ::= "Items: " item ("," ws item){0,3} "."
item ::= qty ws name
qty  ::= [1-9] [0-9]?
name ::=
    [a-z]{1,12}
ws   ::= " "
"#;

/// Whether `text` is in the language of [`GBNF_LIST`].
fn in_gbnf_list(text: &str) -> bool {
    let Some(items) = text.strip_prefix("Items: ").and_then(|r| r.strip_suffix('.')) else {
        return false;
    };
    let items: Vec<&str> = items.split(", ").collect();
    (1..=4).contains(&items.len())
        && items.iter().all(|it| {
            let Some((n, w)) = it.split_once(' ') else { return false };
            n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n))
                && !n.starts_with('0')
                && (1..=12).contains(&w.len())
                && w.bytes().all(|c| c.is_ascii_lowercase())
        })
}

/// Whether `text` is in the language of `s`, checked independently of the constraint engine.
fn accepted(s: &StructuredOutput, text: &str) -> bool {
    match s {
        StructuredOutput::Json(_) => {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else { return false };
            let age = v["age"].as_i64().unwrap_or(-1);
            let city = v["address"]["city"].as_str().unwrap_or("");
            v["name"].as_str().is_some_and(|n| n.chars().count() <= 20)
                && (0..=120).contains(&age)
                && v["tags"].as_array().is_none_or(|t| {
                    t.len() <= 3
                        && t.iter().all(|x| ["a", "b", "c"].contains(&x.as_str().unwrap_or("")))
                })
                && city.len() >= 2
                && city.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && city.chars().skip(1).all(|c| c.is_ascii_lowercase())
                && v.as_object()
                    .unwrap()
                    .keys()
                    .all(|k| ["name", "age", "tags", "address"].contains(&k.as_str()))
        }
        StructuredOutput::JsonObject => {
            serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
        }
        StructuredOutput::Regex(_) => {
            let b = text.as_bytes();
            b.len() == 8
                && b[3] == b'-'
                && b.iter().enumerate().all(|(i, c)| i == 3 || c.is_ascii_digit())
        }
        StructuredOutput::Choice(c) => c.iter().any(|x| x == text),
        StructuredOutput::Grammar(g) if g == GBNF_LIST => in_gbnf_list(text),
        StructuredOutput::Grammar(_) => {
            text.strip_prefix("The answer is ").and_then(|r| r.strip_suffix('.')).is_some_and(|n| {
                n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n)) && !n.starts_with('0')
            })
        }
    }
}

/// A number at its schema's maximum may be followed only by zeros: after
/// `FRACTION_DIGITS` of them the number must end (unbounded, a greedy small model wrote zeros
/// until `max_tokens`).
#[test]
fn a_number_at_its_bound_ends_after_the_digit_limit() {
    let model =
        Model::load(&model_fetch::default_model_path().unwrap(), LoadOptions::default()).unwrap();
    let tok = &model.tokenizer;
    let compiler = GrammarCompiler::new(tok, model.config.vocab_size).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"w": {"type": "number", "minimum": 0, "maximum": 10}},
        "required": ["w"], "additionalProperties": false
    });
    let mut m = compiler.compile(&StructuredOutput::Json(schema)).unwrap();
    let one = |s: &str| tok.encode(s, false).unwrap()[0];
    let (zero, close) = (one("0"), one("}"));
    for piece in ["{", "\"", "w", "\":", " ", "1", "0", "."] {
        for t in tok.encode(piece, false).unwrap() {
            m.accept(t).unwrap();
        }
    }
    for i in 0..tandem_engine::sampling::structured::FRACTION_DIGITS {
        let allowed = m.allowed();
        assert!(allowed.is_allowed(zero), "zero #{i} refused");
        assert_eq!(allowed.is_allowed(close), i > 0, "after {i} zeros");
        assert!(!allowed.is_allowed(one("5")), "only zeros may follow 10.");
        m.accept(zero).unwrap();
    }
    let allowed = m.allowed();
    assert!(!allowed.is_allowed(zero) && allowed.is_allowed(close));
}

#[test]
fn constraints_that_do_not_compile_are_refused() {
    let mut e = engine(None);
    let bad = [
        StructuredOutput::Regex("[0-9".into()),
        StructuredOutput::Grammar("start: undefined_rule".into()),
        StructuredOutput::Grammar("start: \"a\" ::= \"b\"".into()),
        StructuredOutput::Grammar("root ::= item\n".into()),
        StructuredOutput::Grammar("root ::= [a-z\n".into()),
        StructuredOutput::Json(serde_json::json!({"type": "frobnicate"})),
        StructuredOutput::Json(serde_json::json!([1, 2])),
        StructuredOutput::Choice(vec![]),
    ];
    for (i, s) in bad.into_iter().enumerate() {
        let err = e
            .add_request(
                &format!("bad{i}"),
                Prompt::TokenIds(vec![1, 2]),
                params(s.clone(), 0.0, 1),
                None,
            )
            .unwrap_err();
        assert!(matches!(err, EngineError::Structured(_)), "{s:?}: {err:?}");
        assert!(!err.to_string().is_empty());
    }
    assert!(!e.has_unfinished_requests(), "nothing was queued");
    let p = SamplingParams { ignore_eos: true, ..params(StructuredOutput::JsonObject, 0.0, 1) };
    assert!(matches!(
        e.add_request("eos", Prompt::TokenIds(vec![1]), p, None),
        Err(EngineError::InvalidParam(ref p)) if p.param == "ignore_eos"
    ));
}

#[test]
fn constrained_requests_do_not_speculate() {
    let always =
        SpeculativeConfig { disable_batch_size: usize::MAX, cost_slope: 0.0, ..Default::default() };
    let mut e = engine(Some(always));
    // A prompt that repeats itself gives n-gram proposals something to draft from.
    let prompt = chat(&e, "Repeat: [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]");
    let s = StructuredOutput::Json(serde_json::json!({
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 12
    }));
    e.add_request("c", prompt, params(s, 0.0, 1), None).unwrap();
    let out = e.run_to_completion().unwrap();
    let v: serde_json::Value = serde_json::from_str(&out["c"][0].text).unwrap();
    assert!(v.as_array().unwrap().len() <= 12);
    assert_eq!(e.stats().spec_draft_tokens, 0, "no drafts were proposed");
}

/// Every token's bytes, joined, are what the tokenizer decodes (whole characters compared
/// token by token; pieces of characters through a multi-token encoding).
fn check_token_bytes(model: &Model, text: &str) {
    let tok = &model.tokenizer;
    let bytes = tok.token_bytes();
    let mut checked = 0;
    for (id, b) in bytes.iter().enumerate() {
        let id = id as u32;
        if tok.is_special(id) {
            assert!(b.is_empty());
            continue;
        }
        if let Ok(text) = std::str::from_utf8(b) {
            if !text.is_empty() {
                assert_eq!(
                    tok.decode(&[id], false).unwrap().trim_start(),
                    text.trim_start(),
                    "token {id}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > bytes.len() * 9 / 10, "{checked} of {} tokens checked", bytes.len());
    let ids = tok.encode_plain(text).unwrap();
    let joined: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].clone()).collect();
    assert_eq!(String::from_utf8_lossy(&joined).trim_start(), text);
    assert!(GrammarCompiler::new(tok, model.config.vocab_size).is_ok());
}

#[test]
fn the_vocabulary_trie_spells_tokens_as_the_tokenizer_decodes_them() {
    // Byte-level BPE (SmolLM2): "日本" is made of tokens holding parts of characters.
    let smol = Model::load(&model_fetch::default_model_path().unwrap(), LoadOptions::default());
    check_token_bytes(&smol.unwrap(), "日本 and 🦀 café");
    // SentencePiece with byte fallback (Gemma 3): spaces are '▁', rare bytes '<0xNN>'.
    let gemma = model_fetch::GEMMA3_270M.path().expect("fetch Gemma 3 270M");
    let opts = LoadOptions { kv_cache: KvCacheSize::Tokens(1024), ..Default::default() };
    let gemma = Model::load(&gemma, opts).unwrap();
    check_token_bytes(&gemma, "日本 and 🦀 café \u{10FFFD}");
    // And it constrains: Gemma answers from the list.
    let mut e = LLMEngine::new(gemma, EngineConfig::default());
    let s = StructuredOutput::Choice(vec!["yes".into(), "no".into()]);
    let p = Prompt::Text(
        "<start_of_turn>user\nIs the sky blue? Answer yes or no.<end_of_turn>\n<start_of_turn>model\n"
            .into(),
    );
    e.add_request("g", p, params(s, 1.0, 4), None).unwrap();
    for c in &e.run_to_completion().unwrap()["g"] {
        assert!(c.text == "yes" || c.text == "no", "{:?}", c.text);
    }
}
