//! Structured outputs and tool calling end to end through the disaggregated path (router,
//! prefill worker, decode worker as real processes): the official `openai` SDK's
//! `chat.completions.parse` with nested Pydantic models, streamed `json_schema`, `json_object`,
//! vLLM's `structured_outputs` and `guided_*` fields, LangChain's `with_structured_output` and
//! LiteLLM (`tests/e2e/structured_client.py`); `tools` with `tool_choice` required, named, auto
//! and none, streamed and not, a history with calls and results, LangChain's `bind_tools` and
//! LiteLLM (`tests/e2e/tools_client.py`), with the default model's template (tools described
//! by the server) and with a template that reads `tools` given by `--chat-template`; 50 JSON schemas at temperature 0 and 1 checked with
//! the `jsonschema` package (`tests/e2e/schema_suite.py`). The prefill worker samples the first token under the
//! constraint and the decode worker goes on from there; bad constraints and tool definitions are
//! 400s naming the field; no KV block is left behind on either worker.

mod common;

use common::*;
use serde_json::Value;

/// Each named case of a client's `errors` report was a 400 naming `param`.
fn refused(errors: &Value, cases: &[(&str, &str)]) {
    for (name, param) in cases {
        assert_eq!(errors[name]["status"], 400, "{name}: {}", errors[name]);
        assert_eq!(errors[name]["param"], *param, "{name}: {}", errors[name]);
    }
}

/// Runs one of `tests/e2e`'s client scripts against the router; its JSON report.
fn run_client(script: &str, addr: &str, extra: &[&str]) -> Value {
    let url = format!("http://{addr}/v1");
    let args: Vec<&str> = [url.as_str(), MODEL].into_iter().chain(extra.iter().copied()).collect();
    let got = python_client(script, &args);
    println!("{script}: {}", serde_json::to_string_pretty(&got).unwrap());
    got
}

#[test]
fn structured_outputs_and_tools_through_disaggregated_services() {
    // The fast kernels: what is checked holds by the constraints, not by exact logits, and
    // the exact kernels' f32 reference matmuls made this the suite's longest test.
    let d = decode(&["--disagg-min-tokens=1", "--kernel=fast"], &[]);
    let p = prefill(&["--kernel=fast"], &[]);
    let r = router(&[&d], &[&p]);
    let (d_base, p_base) = (free_blocks(&d), free_blocks(&p));
    let got = run_client("structured_client.py", &r.addr, &[]);

    // Parsed Pydantic objects (validated by the SDK and by Pydantic in the script); the bounds
    // that Pydantic would also check are rechecked here.
    for person in got["parse"].as_array().unwrap().iter().chain([&got["litellm"]]) {
        let age = person["age"].as_i64().unwrap();
        assert!((0..=120).contains(&age), "{person}");
        let zip = person["address"]["zip_code"].as_str().unwrap();
        assert!(zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()), "{person}");
        assert!(["red", "green", "blue"].contains(&person["favourite"].as_str().unwrap()));
    }
    for c in got["choice"].as_array().unwrap() {
        assert!(["Paris", "Lyon", "Marseille"].contains(&c.as_str().unwrap()), "{c}");
    }
    let regex = got["regex"].as_str().unwrap();
    let digits: String = regex.chars().filter(char::is_ascii_digit).collect();
    assert!(regex.starts_with(" +1-") && digits.len() == 8 && regex.len() == 12, "{regex:?}");
    let grammar = got["grammar"].as_str().unwrap();
    let num = grammar.strip_prefix(' ').and_then(|g| g.strip_suffix('.')).unwrap();
    assert!(!num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()), "{grammar:?}");
    assert!(["yes", "no"].contains(&got["guided_choice"].as_str().unwrap()));
    let gbnf = got["gbnf"].as_str().unwrap();
    let reason = gbnf
        .strip_prefix("Yes, because ")
        .or_else(|| gbnf.strip_prefix("No, because "))
        .and_then(|r| r.strip_suffix('.'))
        .unwrap_or_else(|| panic!("{gbnf:?}"));
    assert!((2..=41).contains(&reason.len()), "{gbnf:?}");
    assert!(reason.starts_with(|c: char| c.is_ascii_lowercase()), "{gbnf:?}");
    assert!(reason.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()), "{gbnf:?}");
    let why = got["errors"]["bad_gbnf"]["message"].as_str().unwrap();
    assert!(why.contains("line 1: rule 'answer' is used but never defined"), "{why}");
    let point = &got["llama_json_schema"];
    assert!(point["x"].is_i64() && point["y"].is_i64() && point.as_object().unwrap().len() == 2);
    assert_eq!(got["langchain_json_mode"], "dict");

    // Every refusal is a 400 naming the field that asked.
    refused(
        &got["errors"],
        &[
            ("bad_schema", "response_format.json_schema.schema"),
            ("bad_regex", "structured_outputs.regex"),
            ("bad_grammar", "structured_outputs.grammar"),
            ("bad_gbnf", "grammar"),
            ("two_constraints", "guided_choice"),
            ("unknown_format", "response_format.type"),
            ("ignore_eos", "ignore_eos"),
        ],
    );

    let got = run_client("tools_client.py", &r.addr, &[]);
    let raw = got["raw_named"].as_str().unwrap();
    assert!(raw.starts_with("<tool_call>\n{\"name\": \"add\", \"arguments\": {"), "{raw}");
    for call in got["required"].as_array().unwrap().iter().chain(got["stream"].as_array().unwrap())
    {
        assert!(["get_weather", "add"].contains(&call["name"].as_str().unwrap()), "{call}");
    }
    assert_eq!(got["named"][0]["name"], "add");
    let product = &got["langchain_bind_tools"];
    assert!(product["a"].is_i64() && product["b"].is_i64(), "{product}");
    assert!(got["langchain_function_calling"]["population"].as_i64().unwrap() >= 0);
    assert!(!got["litellm"].as_array().unwrap().is_empty());
    refused(
        &got["errors"],
        &[
            ("bad_name", "tools[0].function.name"),
            ("bad_parameters", "tools[0].function.parameters"),
            ("bad_schema", "tools"),
            ("unknown_function", "tool_choice.function.name"),
            ("required_without_tools", "tool_choice"),
            ("bad_history", "messages[1].tool_call_id"),
        ],
    );

    // The same through a router that lays tools out with a template of its own
    // (`--chat-template`, a ChatML template that reads `tools`): forced calls parse (one per
    // turn: this model repeats parallel calls shown this way until max_tokens), `auto` is
    // well-formed (the small model answers in text), the history is rendered by the template.
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/chatml_tools.jinja");
    let r2 = router_with(&[&d], &[&p], &[&format!("--chat-template={template}")], &[]);
    let got = run_client("tools_client.py", &r2.addr, &["single"]);
    assert_eq!(got["named"][0]["name"], "add");
    assert_eq!(got["errors"]["bad_history"]["param"], "messages[1].tool_call_id");

    // Llama 3's JSON calls, chosen from a template that writes them (`"parameters"`,
    // `<|python_tag|>`): forced calls are written and read back in that format, whole and
    // streamed, and the history's call is laid out by the template.
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/llama3_tools.jinja");
    let r3 = router_with(&[&d], &[&p], &[&format!("--chat-template={template}")], &[]);
    let got = run_client("tools_client.py", &r3.addr, &["single"]);
    let raw = got["raw_named"].as_str().unwrap();
    assert!(raw.starts_with("{\"name\": \"add\", \"parameters\": {"), "{raw}");
    assert_eq!(got["named"][0]["name"], "add");
    assert!(got["stream"][0]["arguments"].is_object());

    // 50 schemas at temperature 0 and 1, checked by `jsonschema`: every output valid (numbers
    // end after at most 8 decimals, so a number at its bound cannot run on in zeros).
    let got = run_client("schema_suite.py", &r.addr, &[]);
    let mut valid = 0;
    for t in ["0", "1"] {
        valid += got[t]["valid"].as_u64().unwrap();
        assert_eq!(got[t]["invalid"].as_array().unwrap().len(), 0, "T={t}: {}", got[t]["invalid"]);
    }
    assert_eq!(valid, 100, "{valid} of 100 outputs valid");

    // The constrained requests were prefilled remotely (the prefill worker sampled their first
    // tokens under the constraint) and nothing leaked.
    let remote =
        metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]).unwrap_or(0.0);
    assert!(remote >= 8.0, "expected remote prefills, got {remote}");
    assert_eq!(wait_metric(&d.addr, "tandem_kv_cache_free_blocks", d_base), Some(d_base));
    assert_eq!(wait_metric(&p.addr, "tandem_kv_cache_free_blocks", p_base), Some(p_base));
}
