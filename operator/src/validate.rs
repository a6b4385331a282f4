//! The operator's own check of a spec, before it touches any workload.
//!
//! The CRD's schema and CEL rules reject most bad specs at the API server; this repeats those
//! rules (an API server may run without CEL, or an object may predate a stricter CRD) and adds
//! what the schema cannot say. A spec that fails is reported as `Degraded` with reason
//! `InvalidSpec` and a Warning Event; the running workloads are left as they were.

use crate::crd::{
    Accelerator, DisaggregationMode, InferenceServiceSpec, KvBackend, PodOverrides, API_KEYS_DIR,
    REDIS_TLS_DIR,
};
use crate::workloads::{CACHE_DIR, CONFIG_HASH_ANNOTATION, CONFIG_KEYS, ROLE_LABEL, SERVICE_LABEL};

/// Every problem with `spec`, as messages naming the field; empty when it is valid.
pub fn problems(spec: &InferenceServiceSpec) -> Vec<String> {
    let mut p = Vec::new();
    if spec.image.trim().is_empty() {
        p.push("spec.image must not be empty".to_string());
    }
    if spec.router.replicas < 1 {
        p.push(format!("spec.router.replicas must be at least 1 (got {})", spec.router.replicas));
    }
    if !(0.0..=100.0).contains(&spec.router.overlap_weight)
        || !(0.0..=100.0).contains(&spec.router.decode_weight)
    {
        p.push("spec.router.overlapWeight and decodeWeight must lie in [0, 100]".to_string());
    }
    let r = &spec.router;
    if let Some(url) = &r.redis_url {
        let tls = url.starts_with("rediss://");
        if !tls && !url.starts_with("redis://") {
            p.push(format!(
                "spec.router.redisUrl must start with redis:// or rediss:// (got {url:?})"
            ));
        }
        let authority =
            url.split_once("://").map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
        if authority.rsplit_once('@').is_some_and(|(auth, _)| auth.contains(':')) {
            p.push(
                "spec.router.redisUrl must hold no password: put it in redisPasswordSecret"
                    .to_string(),
            );
        }
        if r.redis_tls_secret.is_some() && !tls {
            p.push("spec.router.redisTlsSecret needs a rediss:// redisUrl".to_string());
        }
    } else if r.redis_tls_secret.is_some() || r.redis_password_secret.is_some() {
        p.push("spec.router.redisPasswordSecret and redisTlsSecret need redisUrl".to_string());
    }
    if r.gateway.is_some() && !r.inference_pool {
        p.push(
            "spec.router.gateway needs spec.router.inferencePool (the route's backend)".to_string(),
        );
    }
    if r.redis_client_certificate && r.redis_tls_secret.is_none() {
        p.push("spec.router.redisClientCertificate needs redisTlsSecret".to_string());
    }
    if let Some(path) = &spec.model.path {
        if !path.starts_with('/') {
            p.push(format!("spec.model.path must be absolute (got {path:?})"));
        }
    }
    if let Some(uri) = &spec.model.uri {
        if spec.model.path.is_some() || spec.model.pvc.is_some() {
            p.push("spec.model: give uri, or path (and pvc), not both".to_string());
        }
        p.extend(model_uri_problem(uri));
    }
    for (role, w) in [("decode", Some(&spec.decode)), ("prefill", spec.prefill.as_ref())] {
        let Some(w) = w else { continue };
        if w.replicas < 0 {
            p.push(format!("spec.{role}.replicas must not be negative (got {})", w.replicas));
        }
        if !(1..=8).contains(&w.tensor_parallel) {
            p.push(format!(
                "spec.{role}.tensorParallel must be 1 to 8, the GPUs of one node (got {})",
                w.tensor_parallel
            ));
        }
        if w.tensor_parallel > 1 && w.accelerator == Accelerator::Cpu {
            p.push(format!("spec.{role}.tensorParallel > 1 needs accelerator: nvidia"));
        }
        if w.tensor_parallel > 1 && spec.kv_transfer.backend == KvBackend::Nccl {
            p.push(format!(
                "spec.{role}.tensorParallel > 1 needs kvTransfer.backend: tcp (the NCCL page \
                 transport joins single GPUs; a tensor-parallel worker's pages go through the \
                 host, re-sharded by KV head)"
            ));
        }
        if let Some(n) = w.max_num_batched_tokens {
            if n < spec.kv_transfer.block_size {
                p.push(format!("spec.{role}.maxNumBatchedTokens must be at least kvTransfer.blockSize (got {n})"));
            }
        }
    }
    if let Some(prefill) = &spec.prefill {
        if spec.decode.tensor_parallel < prefill.tensor_parallel {
            p.push(format!(
                "spec.decode.tensorParallel ({}) must be at least spec.prefill.tensorParallel ({})",
                spec.decode.tensor_parallel, prefill.tensor_parallel
            ));
        }
        if prefill.speculative.is_some() {
            p.push("spec.prefill.speculative is a decode setting".to_string());
        }
    } else if spec.disaggregation.mode == DisaggregationMode::Always {
        p.push("spec.disaggregation.mode 'always' needs spec.prefill".to_string());
    }
    if ![8, 16, 32, 64, 128].contains(&spec.kv_transfer.block_size) {
        p.push(format!(
            "spec.kvTransfer.blockSize must be one of 8, 16, 32, 64, 128 (got {})",
            spec.kv_transfer.block_size
        ));
    }
    let roles = [
        ("router", spec.router.pod.as_ref()),
        ("prefill", spec.prefill.as_ref().and_then(|w| w.pod.as_ref())),
        ("decode", spec.decode.pod.as_ref()),
    ];
    for (role, o) in roles {
        if let Some(o) = o {
            pod_problems(role, o, &mut p);
        }
    }
    if spec.kv_transfer.backend == KvBackend::Nccl {
        let all_gpu = spec.decode.accelerator == Accelerator::Nvidia
            && spec.prefill.as_ref().is_none_or(|w| w.accelerator == Accelerator::Nvidia);
        if !all_gpu {
            p.push(
                "spec.kvTransfer.backend 'nccl' needs accelerator 'nvidia' on every worker role"
                    .to_string(),
            );
        }
    }
    p
}

/// Names in `spec.<role>.pod` that the operator sets itself: a second value would shadow the
/// operator's (or be shadowed), so they are refused.
fn pod_problems(role: &str, o: &PodOverrides, p: &mut Vec<String>) {
    let at = format!("spec.{role}.pod");
    let own_env = ["POD_NAME", "POD_IP", "TANDEM_INTERNAL_TOKEN", "TANDEM_REDIS_PASSWORD"];
    for e in o.env.iter().flatten() {
        if own_env.contains(&e.name.as_str()) || CONFIG_KEYS.contains(&e.name.as_str()) {
            p.push(format!("{at}.env: {} is set by the operator from the spec", e.name));
        }
    }
    let own_volumes = ["cache", "models", "redis-tls", "api-keys"];
    let volumes: Vec<&str> = o.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    for v in &volumes {
        if own_volumes.contains(v) {
            p.push(format!("{at}.volumes: the name {v} is the operator's"));
        }
    }
    let own_paths = [CACHE_DIR, "/models", REDIS_TLS_DIR, API_KEYS_DIR];
    for m in o.volume_mounts.iter().flatten() {
        if !volumes.contains(&m.name.as_str()) {
            p.push(format!("{at}.volumeMounts: {} names no volume of {at}.volumes", m.name));
        }
        let path = m.mount_path.trim_end_matches('/');
        if own_paths.iter().any(|o| path == *o || o.starts_with(&format!("{path}/"))) {
            p.push(format!(
                "{at}.volumeMounts: {} covers a path the operator mounts",
                m.mount_path
            ));
        }
    }
    for k in o.labels.iter().flat_map(|l| l.keys()) {
        if [SERVICE_LABEL, ROLE_LABEL, "app.kubernetes.io/name"].contains(&k.as_str()) {
            p.push(format!("{at}.labels: {k} is the operator's (it selects the pods)"));
        }
    }
    if o.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_HASH_ANNOTATION)) {
        p.push(format!("{at}.annotations: {CONFIG_HASH_ANNOTATION} is the operator's"));
    }
}

/// What is wrong with a `model.uri`, if anything.
fn model_uri_problem(uri: &str) -> Option<String> {
    let claim_ok = |c: &str| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
            && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
    };
    let ok = if let Some(rest) = uri.strip_prefix("pvc://") {
        rest.split_once('/')
            .is_some_and(|(c, p)| claim_ok(c) && !p.is_empty() && !p.starts_with('/'))
    } else if let Some(p) = uri.strip_prefix("file:///") {
        !p.is_empty() && !p.starts_with('/')
    } else if uri.starts_with("file:") || uri.starts_with("pvc:") {
        false
    } else {
        let scheme = uri.split_once("://").map_or(uri, |(s, _)| s);
        return Some(format!(
            "spec.model.uri: Tandem fetches no model from '{scheme}://' (no hub or object-store access): copy the file onto a PersistentVolumeClaim and use pvc://<claim>/<path>, or into the image and use file:///<path>"
        ));
    };
    (!ok).then(|| {
        format!("spec.model.uri must be pvc://<claim>/<path> or file:///<path> (got {uri:?})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::InferenceService;
    use kube::CustomResourceExt;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> InferenceServiceSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_are_valid_and_each_rule_names_its_field() {
        assert!(problems(&spec(json!({}))).is_empty());
        assert!(problems(&spec(json!({ "prefill": {}, "disaggregation": { "mode": "always" } })))
            .is_empty());
        let cases = [
            (json!({ "router": { "replicas": 0 } }), "spec.router.replicas"),
            (json!({ "decode": { "replicas": -1 } }), "spec.decode.replicas"),
            (
                json!({ "prefill": { "tensorParallel": 2, "accelerator": "nvidia" }, "decode": { "accelerator": "nvidia" } }),
                "spec.decode.tensorParallel (1) must be at least",
            ),
            (json!({ "disaggregation": { "mode": "always" } }), "needs spec.prefill"),
            (json!({ "kvTransfer": { "blockSize": 12 } }), "blockSize"),
            (json!({ "kvTransfer": { "backend": "nccl" } }), "needs accelerator 'nvidia'"),
            (json!({ "prefill": { "speculative": { "method": "ngram" } } }), "decode setting"),
            (json!({ "model": { "path": "models/x.gguf" } }), "spec.model.path"),
            (json!({ "model": { "uri": "hf://org/model" } }), "fetches no model from 'hf://'"),
            (
                json!({ "router": { "gateway": { "name": "gw" }, "inferencePool": false } }),
                "needs spec.router.inferencePool",
            ),
            (
                json!({ "decode": { "pod": { "env": [{ "name": "TANDEM_MODEL", "value": "x" }] } } }),
                "spec.decode.pod.env: TANDEM_MODEL is set by the operator",
            ),
            (
                json!({ "router": { "pod": { "volumes": [{ "name": "cache", "emptyDir": {} }] } } }),
                "spec.router.pod.volumes: the name cache",
            ),
            (
                json!({ "prefill": { "pod": { "volumeMounts": [{ "name": "x", "mountPath": "/data" }] } } }),
                "names no volume",
            ),
            (
                json!({ "decode": { "pod": { "volumes": [{ "name": "x", "emptyDir": {} }], "volumeMounts": [{ "name": "x", "mountPath": "/etc/tandem" }] } } }),
                "covers a path the operator mounts",
            ),
            (
                json!({ "decode": { "pod": { "labels": { "app.kubernetes.io/component": "router" } } } }),
                "selects the pods",
            ),
            (
                json!({ "decode": { "pod": { "annotations": { "tandem.dev/config-hash": "x" } } } }),
                "config-hash is the operator's",
            ),
            (json!({ "model": { "uri": "s3://bucket/m.gguf" } }), "fetches no model from 's3://'"),
            (json!({ "model": { "uri": "pvc://Claim/m.gguf" } }), "spec.model.uri must be"),
            (json!({ "model": { "uri": "pvc://models" } }), "spec.model.uri must be"),
            (json!({ "model": { "uri": "file://relative" } }), "spec.model.uri must be"),
            (json!({ "model": { "uri": "pvc://m/a.gguf", "path": "/models/a.gguf" } }), "not both"),
            (json!({ "router": { "redisUrl": "http://x" } }), "redisUrl"),
            (json!({ "router": { "redisUrl": "redis://u:pw@r:6379" } }), "no password"),
            (json!({ "router": { "redisUrl": "redis://r", "redisTlsSecret": "t" } }), "rediss://"),
            (json!({ "router": { "redisPasswordSecret": "p" } }), "need redisUrl"),
            (
                json!({ "router": { "redisUrl": "rediss://r", "redisClientCertificate": true } }),
                "needs redisTlsSecret",
            ),
            (json!({ "decode": { "tensorParallel": 2 } }), "needs accelerator: nvidia"),
            (
                json!({ "decode": { "tensorParallel": 9, "accelerator": "nvidia" } }),
                "spec.decode.tensorParallel must be 1 to 8",
            ),
            (
                json!({ "decode": { "tensorParallel": 2, "accelerator": "nvidia" }, "kvTransfer": { "backend": "nccl" } }),
                "needs kvTransfer.backend: tcp",
            ),
        ];
        for (v, want) in cases {
            let p = problems(&spec(v.clone()));
            assert!(p.iter().any(|m| m.contains(want)), "{v}: {p:?}");
        }
    }

    /// The same rules as CEL in the CRD, evaluated by kube's CEL interpreter on the same
    /// specs: the API server and the operator agree.
    #[test]
    fn crd_cel_rules_agree() {
        let crd = serde_json::to_value(InferenceService::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let text = schema.to_string();
        for rule in [
            "self.decode.tensorParallel >= self.prefill.tensorParallel",
            "self.disaggregation.mode != 'always' || has(self.prefill)",
            "self in [8, 16, 32, 64, 128]",
        ] {
            assert!(text.contains(rule), "missing rule {rule}");
        }
        let spec_schema = &schema["properties"]["spec"];
        let cases = [
            (json!({}), true),
            (
                json!({ "prefill": { "tensorParallel": 2, "accelerator": "nvidia" }, "decode": { "tensorParallel": 1, "accelerator": "nvidia" } }),
                false,
            ),
            (
                json!({ "prefill": { "tensorParallel": 1 }, "decode": { "tensorParallel": 1 } }),
                true,
            ),
            (json!({ "disaggregation": { "mode": "always" } }), false),
            (json!({ "kvTransfer": { "blockSize": 12 } }), false),
            (json!({ "kvTransfer": { "backend": "nccl" } }), false),
            (json!({ "prefill": { "speculative": { "method": "ngram" } } }), false),
            (
                json!({ "router": { "redisUrl": "rediss://app@r:6380/1", "redisPasswordSecret": "p", "redisTlsSecret": "t", "redisClientCertificate": true } }),
                true,
            ),
            (json!({ "router": { "redisUrl": "redis://r:6379" } }), true),
            (json!({ "model": { "uri": "pvc://models-1/llama/q4_k_m.gguf" } }), true),
            (json!({ "model": { "uri": "file:///opt/m.gguf" } }), true),
            (json!({ "model": { "uri": "hf://org/m" } }), false),
            (json!({ "model": { "uri": "pvc://Models/m.gguf" } }), false),
            (json!({ "model": { "uri": "pvc://m" } }), false),
            (json!({ "model": { "uri": "pvc://m/a", "pvc": "m" } }), false),
            (json!({ "router": { "gateway": { "name": "gw" } } }), true),
            (json!({ "router": { "gateway": { "name": "gw" }, "inferencePool": false } }), false),
            (json!({ "router": { "redisUrl": "http://r:6379" } }), false),
            (json!({ "router": { "redisUrl": "redis://app:pw@r:6379" } }), false),
            (json!({ "router": { "redisUrl": "redis://r:6379", "redisTlsSecret": "t" } }), false),
            (json!({ "router": { "redisPasswordSecret": "p" } }), false),
            (
                json!({ "router": { "redisUrl": "rediss://r", "redisClientCertificate": true } }),
                false,
            ),
        ];
        for (v, ok) in cases {
            // As the API server would: schema defaults applied, then the rules.
            let cel = kube::core::cel::Validator::new().validate(spec_schema, &v, None);
            assert_eq!(cel.is_ok(), ok, "{v}: CEL said {cel:?}");
            let mine = problems(&spec(v.clone()));
            let mine_ok = mine.is_empty();
            assert_eq!(mine_ok, ok, "{v}: operator said {mine:?}");
        }
    }
}
