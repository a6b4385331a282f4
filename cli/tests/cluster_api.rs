//! The router's view of its fleet: `/health` with a status and a reason, `/v1/cluster/status`
//! and `/v1/cluster/nodes`, with real workers, one of which goes away.

mod common;

use common::*;
use serde_json::Value;

fn get(r: &Proc, path: &str) -> (u16, Value) {
    let res = http(&r.addr, "GET", path, None);
    (res.status, res.json())
}

#[test]
fn health_and_cluster_status_follow_the_workers() {
    let d = decode(&[], &[]);
    let mut p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);

    let (s, h) = get(&r, "/health");
    assert_eq!((s, h["status"].as_str()), (200, Some("healthy")), "{h}");
    assert!(h["reason"].as_str().unwrap().contains("all 2 workers"), "{h}");

    let (s, nodes) = get(&r, "/v1/cluster/nodes");
    assert_eq!(s, 200, "{nodes}");
    let nodes = nodes["data"].as_array().unwrap().clone();
    assert_eq!(nodes.len(), 2);
    for n in &nodes {
        assert_eq!(n["healthy"], true, "{n}");
        assert!(n["device"].as_str().unwrap().starts_with("cpu: "), "{n}");
        assert!(n["num_blocks"].as_u64().unwrap() > 0, "{n}");
    }
    let (s, c) = get(&r, "/v1/cluster/status");
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["model"], MODEL);
    for role in ["prefill", "decode"] {
        assert_eq!(
            (c["roles"][role]["workers"].as_u64(), c["roles"][role]["healthy"].as_u64()),
            (Some(1), Some(1)),
            "{c}"
        );
        let node = nodes.iter().find(|n| n["role"] == role).unwrap();
        assert_eq!(c["roles"][role]["kv_blocks"], node["num_blocks"], "the status sums the nodes");
    }

    // The prefill worker goes away: degraded, with the reason; the status counts it out.
    let addr = p.addr.clone();
    p.kill();
    let (s, h) = get(&r, "/health");
    assert_eq!((s, h["status"].as_str()), (200, Some("degraded")), "{h}");
    assert!(h["reason"].as_str().unwrap().contains(&format!("prefill worker {addr}")), "{h}");
    let (_, c) = get(&r, "/v1/cluster/status");
    assert_eq!(c["roles"]["prefill"]["healthy"], 0, "{c}");
    let (_, nodes) = get(&r, "/v1/cluster/nodes");
    let gone = nodes["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["address"] == addr.as_str())
        .cloned()
        .unwrap();
    assert_eq!(gone["healthy"], false);
    assert!(gone["error"].is_string(), "{gone}");
}

/// Every response carries seed 001's `timing` (milliseconds): queue (router and decode worker
/// wait), prefill (to the first token; on the prefill worker here), decode and total. Each part
/// is measured where it happens and the parts add up to the router's total within a few ms,
/// whole and streamed (the streamed timing rides on the chunk that ends the last choice).
#[test]
fn timings_are_measured_where_they_happen_and_add_up() {
    let d = decode(&["--disagg-min-tokens=1"], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let body = format!(
        r#"{{"model": "{MODEL}", "prompt": "{}", "max_tokens": 24, "temperature": 0, "ignore_eos": true}}"#,
        long_prompt()
    );
    let check = |t: &Value| -> (f64, f64, f64, f64) {
        let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("timing lacks {k}: {t}"));
        let (q, pf, dc, total) =
            (f("queue_time_ms"), f("prefill_time_ms"), f("decode_time_ms"), f("total_time_ms"));
        println!(
            "queue {q:.2} + prefill {pf:.2} + decode {dc:.2} = {:.2} vs total {total:.2} ms",
            q + pf + dc
        );
        assert!(q >= 0.0 && pf > 0.0 && dc > 0.0, "{t}");
        assert!((q + pf + dc - total).abs() < 25.0, "parts do not add up to the total: {t}");
        (q, pf, dc, total)
    };
    let res = http(&r.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(res.status, 200, "{}", res.body);
    check(&res.json()["timing"]);

    let stream_body = body.replace(r#""temperature": 0"#, r#""temperature": 0, "stream": true"#);
    let mut s = open_stream(&r.addr, "/v1/completions", &stream_body);
    let text = read_until(&mut s, "data: [DONE]");
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let timed: Vec<&Value> = chunks.iter().filter(|c| c.get("timing").is_some()).collect();
    assert_eq!(timed.len(), 1, "one chunk carries the timing");
    assert_eq!(timed[0]["choices"][0]["finish_reason"], "length", "{}", timed[0]);
    check(&timed[0]["timing"]);
    // The prompt was prefilled remotely: its prefill time includes the page transfer.
    let remote =
        metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]).unwrap_or(0.0);
    assert!(remote >= 1.0);
}

/// Prompt and generation token counters, summed over the prefill and the decode worker, equal
/// the tokens clients received: a remotely prefilled prompt and its first token count on the
/// prefill worker only, a prompt the decode worker prefills itself counts there.
#[test]
fn token_counters_count_each_token_once_across_roles() {
    let d = decode(&["--disagg-min-tokens=16"], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let sum = |name: &str| metric_sum(&p.addr, name) + metric_sum(&d.addr, name);
    let (mut prompt, mut generated) = (0u64, 0u64);
    let prompts =
        [long_prompt(), "Hi".to_string(), format!("Meanwhile, far away: {}", long_prompt())];
    for (i, text) in prompts.iter().enumerate() {
        let stream = i == 2;
        let body = serde_json::json!({
            "model": MODEL, "prompt": text, "max_tokens": 5 + i, "temperature": 0,
            "ignore_eos": true, "stream": stream,
            "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { Value::Null },
        })
        .to_string();
        let usage = if stream {
            let mut s = open_stream(&r.addr, "/v1/completions", &body);
            let text = read_until(&mut s, "data: [DONE]");
            let last = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|l| *l != "[DONE]")
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|c| c["usage"].is_object())
                .expect("a usage chunk");
            last["usage"].clone()
        } else {
            let res = http(&r.addr, "POST", "/v1/completions", Some(&body));
            assert_eq!(res.status, 200, "{}", res.body);
            res.json()["usage"].clone()
        };
        assert_eq!(usage["completion_tokens"], 5 + i as u64, "{usage}");
        prompt += usage["prompt_tokens"].as_u64().unwrap();
        generated += usage["completion_tokens"].as_u64().unwrap();
    }
    let decisions = |k: &str| {
        metric(&d.addr, "tandem_disagg_decisions_total", &[&format!("decision=\"{k}\"")])
            .unwrap_or(0.0)
    };
    assert_eq!((decisions("remote"), decisions("local_short")), (2.0, 1.0));
    assert_eq!(sum("tandem_prompt_tokens_total"), prompt as f64);
    assert_eq!(sum("tandem_generation_tokens_total"), generated as f64);
    assert!(metric_sum(&p.addr, "tandem_prompt_tokens_total") > 0.0, "the prefill worker counts");
    assert_eq!(metric_sum(&p.addr, "tandem_generation_tokens_total"), 2.0, "one first token each");
}
