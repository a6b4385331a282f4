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
