//! The objects an `InferenceService` is made of, built from its spec: the ConfigMap the services
//! read, one Deployment, Service and PodDisruptionBudget per role, and a ServiceMonitor.
//!
//! Every object carries the labels [`selector_labels`] (so the operator finds its objects with
//! one list per kind), an owner reference to the `InferenceService`, and the annotation
//! [`HASH_ANNOTATION`]: a digest of the object as built, which lets the controller skip objects
//! that already match without comparing against fields the API server defaulted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::crd::{DisaggregationMode, InferenceService};

mod pods;
use pods::deployment;

/// Annotation holding the digest of the object as the operator built it.
pub const HASH_ANNOTATION: &str = "tandem.dev/applied-hash";
/// Pod-template annotation that changes with the ConfigMap, so a config change rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "tandem.dev/config-hash";
/// Label naming the `InferenceService` an object belongs to.
pub const SERVICE_LABEL: &str = "tandem.dev/service";
/// Label naming the role (`router`, `prefill`, `decode`).
pub const ROLE_LABEL: &str = "app.kubernetes.io/component";

/// The router's HTTP port (OpenAI API, `/metrics`, `/health`).
pub const ROUTER_PORT: i32 = 8000;
/// The prefill workers' gRPC + HTTP port.
pub const PREFILL_PORT: i32 = 50051;
/// The decode workers' gRPC + HTTP port.
pub const DECODE_PORT: i32 = 50061;
/// The decode workers' KV page port.
pub const KV_PORT: i32 = 50062;
/// The router's endpoint picker port (`ext_proc` gRPC, Gateway API Inference Extension).
pub const EPP_PORT: i32 = 9002;
/// Where the workers keep the fetched default model.
pub const CACHE_DIR: &str = "/var/cache/tandem";

/// A role of the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The OpenAI gateway.
    Router,
    /// Prefill workers.
    Prefill,
    /// Decode workers.
    Decode,
}

impl Role {
    /// All roles, in the order they are deleted (traffic first).
    pub const ALL: [Role; 3] = [Role::Router, Role::Prefill, Role::Decode];

    /// The label value and name suffix.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Router => "router",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// The kinds of object the operator manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `v1/ConfigMap`.
    ConfigMap,
    /// `apps/v1/Deployment`.
    Deployment,
    /// `v1/Service`.
    Service,
    /// `policy/v1/PodDisruptionBudget`.
    PodDisruptionBudget,
    /// `monitoring.coreos.com/v1/ServiceMonitor` (only where that API exists).
    ServiceMonitor,
    /// `inference.networking.k8s.io/v1/InferencePool` (only where that API exists).
    InferencePool,
    /// `gateway.networking.k8s.io/v1/HTTPRoute` (with `router.gateway`, where that API exists).
    HttpRoute,
}

impl Kind {
    /// Every managed kind, in apply order (configuration before the pods that read it).
    pub const ALL: [Kind; 7] = [
        Kind::ConfigMap,
        Kind::Service,
        Kind::Deployment,
        Kind::PodDisruptionBudget,
        Kind::ServiceMonitor,
        Kind::InferencePool,
        Kind::HttpRoute,
    ];

    /// Whether the kind's API is an optional add-on: a cluster without it answers 404, and the
    /// operator then does without the objects.
    pub fn optional(self) -> bool {
        matches!(self, Kind::ServiceMonitor | Kind::InferencePool | Kind::HttpRoute)
    }

    /// Group, version, kind and plural of the kind's API.
    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::ConfigMap => ("", "v1", "ConfigMap", "configmaps"),
            Kind::Deployment => ("apps", "v1", "Deployment", "deployments"),
            Kind::Service => ("", "v1", "Service", "services"),
            Kind::PodDisruptionBudget => {
                ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
            }
            Kind::ServiceMonitor => {
                ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")
            }
            Kind::InferencePool => {
                ("inference.networking.k8s.io", "v1", "InferencePool", "inferencepools")
            }
            Kind::HttpRoute => ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes"),
        };
        let api_version =
            if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version,
            kind: kind.into(),
            plural: plural.into(),
        }
    }
}

/// One object the operator wants to exist.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// The whole object (apiVersion, kind, metadata with the hash annotation, spec or data).
    pub object: Value,
}

impl Desired {
    /// The digest stored in [`HASH_ANNOTATION`].
    pub fn hash(&self) -> &str {
        self.object["metadata"]["annotations"][HASH_ANNOTATION].as_str().unwrap_or_default()
    }
}

/// Labels every object of `isvc` carries (and selects its objects by).
pub fn selector_labels(isvc: &InferenceService) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "tandem".to_string()),
        ("app.kubernetes.io/instance".to_string(), isvc.name_any()),
        ("app.kubernetes.io/managed-by".to_string(), "tandem-operator".to_string()),
        (SERVICE_LABEL.to_string(), isvc.name_any()),
    ])
}

/// The label selector string of `isvc`'s objects.
pub fn selector_string(isvc: &InferenceService) -> String {
    format!("{SERVICE_LABEL}={}", isvc.name_any())
}

/// Name of a role's Deployment (and PodDisruptionBudget).
pub fn role_name(isvc: &InferenceService, role: Role) -> String {
    format!("{}-{}", isvc.name_any(), role.as_str())
}

/// Label selector of one role's pods.
pub fn role_selector(isvc: &InferenceService, role: Role) -> String {
    format!("{SERVICE_LABEL}={},{ROLE_LABEL}={}", isvc.name_any(), role.as_str())
}

/// Whether the router sends prompts to prefill workers.
pub fn uses_prefill(isvc: &InferenceService) -> bool {
    isvc.spec.prefill.is_some() && isvc.spec.disaggregation.mode != DisaggregationMode::Never
}

/// The OpenAI base URL inside the cluster.
pub fn endpoint(isvc: &InferenceService) -> String {
    format!(
        "http://{}.{}.svc:{ROUTER_PORT}/v1",
        isvc.name_any(),
        isvc.namespace().unwrap_or_else(|| "default".into())
    )
}

fn digest(v: &Value) -> String {
    let bytes = serde_json::to_vec(v).expect("json");
    let d = Sha256::digest(&bytes);
    d.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Everything `isvc` should consist of. `service_monitors`: whether the cluster serves the
/// ServiceMonitor API.
pub fn desired(isvc: &InferenceService, apis: &[Kind]) -> Vec<Desired> {
    let config = config_map(isvc);
    let config_hash = digest(&json!(config.data));
    let mut out = vec![finish(isvc, Kind::ConfigMap, config)];
    let mut roles = vec![Role::Router, Role::Decode];
    if isvc.spec.prefill.is_some() {
        roles.insert(1, Role::Prefill);
    }
    out.push(finish(isvc, Kind::Service, router_service(isvc)));
    for &role in &roles[1..] {
        out.push(finish(isvc, Kind::Service, worker_service(isvc, role)));
    }
    for &role in &roles {
        out.push(finish(isvc, Kind::Deployment, deployment(isvc, role, &config_hash)));
    }
    for &role in &roles {
        out.push(finish(isvc, Kind::PodDisruptionBudget, pdb(isvc, role)));
    }
    if apis.contains(&Kind::ServiceMonitor) && isvc.spec.monitoring.service_monitor {
        out.push(finish(isvc, Kind::ServiceMonitor, service_monitor(isvc)));
    }
    if apis.contains(&Kind::InferencePool) && isvc.spec.router.inference_pool {
        out.push(finish(isvc, Kind::InferencePool, inference_pool(isvc)));
        if apis.contains(&Kind::HttpRoute) && isvc.spec.router.gateway.is_some() {
            out.push(finish(isvc, Kind::HttpRoute, http_route(isvc)));
        }
    }
    out
}

/// The decode workers as a Gateway API Inference Extension pool (they serve the OpenAI API on
/// their port), with the router's Service as the endpoint picker.
fn inference_pool(isvc: &InferenceService) -> Value {
    json!({
        "metadata": { "name": isvc.name_any() },
        "spec": {
            "selector": { "matchLabels": role_selector_labels(isvc, Role::Decode) },
            "targetPorts": [{ "number": DECODE_PORT }],
            "endpointPickerRef": {
                "kind": "Service",
                "name": isvc.name_any(),
                "port": { "number": EPP_PORT },
                "failureMode": isvc.spec.router.picker_failure_mode,
            },
        },
    })
}

/// An `HTTPRoute` from `router.gateway` to the service's pool.
fn http_route(isvc: &InferenceService) -> Value {
    let gw = isvc.spec.router.gateway.as_ref().expect("a gateway");
    let mut parent =
        json!({ "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw.name });
    if let Some(ns) = &gw.namespace {
        parent["namespace"] = json!(ns);
    }
    if let Some(s) = &gw.section_name {
        parent["sectionName"] = json!(s);
    }
    json!({
        "metadata": { "name": isvc.name_any() },
        "spec": {
            "parentRefs": [parent],
            "rules": [{
                "matches": [{ "path": { "type": "PathPrefix", "value": "/" } }],
                "backendRefs": [{ "group": "inference.networking.k8s.io", "kind": "InferencePool", "name": isvc.name_any() }],
                "timeouts": { "request": format!("{}s", gw.request_timeout_seconds) },
            }],
        },
    })
}

/// Serialises a typed object and adds apiVersion/kind, the common labels, the owner reference
/// and the hash annotation.
fn finish(isvc: &InferenceService, kind: Kind, object: impl serde::Serialize) -> Desired {
    let mut object = serde_json::to_value(object).expect("Kubernetes objects serialise");
    let ar = kind.api_resource();
    object["apiVersion"] = json!(ar.api_version);
    object["kind"] = json!(ar.kind);
    let meta = &mut object["metadata"];
    meta["namespace"] = json!(isvc.namespace());
    let mut labels = selector_labels(isvc);
    if let Some(extra) = meta["labels"].as_object() {
        for (k, v) in extra {
            labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
    }
    meta["labels"] = json!(labels);
    if let Some(owner) = isvc.controller_owner_ref(&()) {
        meta["ownerReferences"] = json!([owner]);
    }
    let hash = digest(&object);
    object["metadata"]["annotations"] = json!({ HASH_ANNOTATION: hash });
    let name = object["metadata"]["name"].as_str().expect("named").to_string();
    Desired { kind, name, object }
}

/// Every variable [`config_data`] may set (a pod override may not set them again).
pub const CONFIG_KEYS: [&str; 17] = [
    "TANDEM_BLOCK_SIZE",
    "TANDEM_CACHE_DIR",
    "TANDEM_DECODE_WEIGHT",
    "TANDEM_DISAGG_MIN_TOKENS",
    "TANDEM_KV_FAILURE_POLICY",
    "TANDEM_KV_TRANSPORT",
    "TANDEM_LOG_FORMAT",
    "TANDEM_MODEL",
    "TANDEM_OVERLAP_WEIGHT",
    "TANDEM_REDIS_CA_CERT",
    "TANDEM_REDIS_CLIENT_CERT",
    "TANDEM_REDIS_CLIENT_KEY",
    "TANDEM_REDIS_URL",
    "TANDEM_ROUTING_POLICY",
    "TANDEM_SERVED_MODEL_NAME",
    "TANDEM_TRANSFER_TIMEOUT",
    "TANDEM_ZERO_FREED_BLOCKS",
];

/// The environment every service reads (`envFrom`): model, block size, routing and transfer
/// settings. The services take each of these from the variable when the flag is not given.
pub fn config_data(isvc: &InferenceService) -> BTreeMap<String, String> {
    let s = &isvc.spec;
    let mut d = BTreeMap::new();
    if let (Some(path), _) = &s.model.source() {
        d.insert("TANDEM_MODEL".into(), path.clone());
    }
    if let Some(name) = &s.model.name {
        d.insert("TANDEM_SERVED_MODEL_NAME".into(), name.clone());
    }
    d.insert("TANDEM_CACHE_DIR".into(), CACHE_DIR.into());
    d.insert("TANDEM_LOG_FORMAT".into(), "json".into());
    d.insert("TANDEM_BLOCK_SIZE".into(), s.kv_transfer.block_size.to_string());
    d.insert("TANDEM_TRANSFER_TIMEOUT".into(), format!("{}s", s.kv_transfer.timeout_seconds));
    d.insert("TANDEM_KV_FAILURE_POLICY".into(), s.kv_transfer.failure_policy.as_str().into());
    d.insert("TANDEM_KV_TRANSPORT".into(), s.kv_transfer.backend.as_str().into());
    let min_tokens = match s.disaggregation.mode {
        DisaggregationMode::Always => 1,
        _ => s.disaggregation.min_tokens,
    };
    d.insert("TANDEM_DISAGG_MIN_TOKENS".into(), min_tokens.to_string());
    d.insert("TANDEM_ROUTING_POLICY".into(), s.router.policy.as_str().into());
    d.insert("TANDEM_OVERLAP_WEIGHT".into(), s.router.overlap_weight.to_string());
    d.insert("TANDEM_DECODE_WEIGHT".into(), s.router.decode_weight.to_string());
    if let Some(url) = &s.router.redis_url {
        d.insert("TANDEM_REDIS_URL".into(), url.clone());
    }
    if s.router.redis_tls_secret.is_some() {
        let dir = crate::crd::REDIS_TLS_DIR;
        d.insert("TANDEM_REDIS_CA_CERT".into(), format!("{dir}/ca.crt"));
        if s.router.redis_client_certificate {
            d.insert("TANDEM_REDIS_CLIENT_CERT".into(), format!("{dir}/tls.crt"));
            d.insert("TANDEM_REDIS_CLIENT_KEY".into(), format!("{dir}/tls.key"));
        }
    }
    if s.security.zero_freed_blocks {
        d.insert("TANDEM_ZERO_FREED_BLOCKS".into(), "true".into());
    }
    d
}

fn meta(name: String, role: Option<Role>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: role.map(|r| BTreeMap::from([(ROLE_LABEL.to_string(), r.as_str().to_string())])),
        ..ObjectMeta::default()
    }
}

fn config_map(isvc: &InferenceService) -> ConfigMap {
    ConfigMap {
        metadata: meta(format!("{}-config", isvc.name_any()), None),
        data: Some(config_data(isvc)),
        ..ConfigMap::default()
    }
}

/// The labels selecting one role's pods.
fn role_selector_labels(isvc: &InferenceService, role: Role) -> BTreeMap<String, String> {
    let mut sel = selector_labels(isvc);
    sel.insert(ROLE_LABEL.into(), role.as_str().into());
    sel
}

fn tcp_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

fn router_service(isvc: &InferenceService) -> Service {
    let kind = match isvc.spec.router.service_type {
        crate::crd::ServiceType::ClusterIP => "ClusterIP",
        crate::crd::ServiceType::NodePort => "NodePort",
        crate::crd::ServiceType::LoadBalancer => "LoadBalancer",
    };
    Service {
        metadata: meta(isvc.name_any(), Some(Role::Router)),
        spec: Some(ServiceSpec {
            type_: Some(kind.into()),
            selector: Some(role_selector_labels(isvc, Role::Router)),
            ports: Some(vec![
                tcp_port("http", ROUTER_PORT),
                ServicePort {
                    app_protocol: Some("kubernetes.io/h2c".into()),
                    ..tcp_port("epp", EPP_PORT)
                },
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Headless: its DNS name resolves to every ready worker's address, which is how routers find
/// the workers.
fn worker_service(isvc: &InferenceService, role: Role) -> Service {
    let port = if role == Role::Prefill { PREFILL_PORT } else { DECODE_PORT };
    Service {
        metadata: meta(role_name(isvc, role), Some(role)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(false),
            selector: Some(role_selector_labels(isvc, role)),
            ports: Some(vec![tcp_port("grpc", port)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn pdb(isvc: &InferenceService, role: Role) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(role_name(isvc, role), Some(role)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(role_selector_labels(isvc, role)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Prometheus Operator's `ServiceMonitor` (not a Kubernetes API type): the fields Tandem
/// sets.
#[derive(serde::Serialize)]
struct ServiceMonitor {
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

#[derive(serde::Serialize)]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(serde::Serialize)]
struct MonitorEndpoint {
    port: &'static str,
    path: &'static str,
    interval: &'static str,
}

fn service_monitor(isvc: &InferenceService) -> ServiceMonitor {
    let scrape = |port| MonitorEndpoint { port, path: "/metrics", interval: "15s" };
    ServiceMonitor {
        metadata: meta(isvc.name_any(), None),
        spec: ServiceMonitorSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(SERVICE_LABEL.to_string(), isvc.name_any())])),
                ..Default::default()
            },
            endpoints: vec![scrape("http"), scrape("grpc")],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::pods::container_args;
    use super::*;
    use crate::crd::{InferenceServiceSpec, SpeculativeMethod, SpeculativeSpec};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    fn isvc(spec: Value) -> InferenceService {
        let spec: InferenceServiceSpec = serde_json::from_value(spec).unwrap();
        let mut i = InferenceService::new("chat", spec);
        i.metadata.namespace = Some("ml".into());
        i.metadata.uid = Some("uid-1".into());
        i
    }

    /// Parses `v` as `T` and requires the typed object to serialize back to the same JSON:
    /// a misspelt or misplaced field would be dropped and fail the comparison.
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) {
        let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v:#}"));
        assert_eq!(&serde_json::to_value(&typed).unwrap(), v);
    }

    #[test]
    fn every_object_parses_as_its_kubernetes_type() {
        let i = isvc(
            json!({ "prefill": { "replicas": 2 }, "decode": { "replicas": 3, "speculative": { "method": "ngram" } }, "router": { "redisUrl": "redis://r:6379" } }),
        );
        let objs = desired(&i, &Kind::ALL);
        let names: Vec<_> = objs.iter().map(|d| (d.kind, d.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (Kind::ConfigMap, "chat-config"),
                (Kind::Service, "chat"),
                (Kind::Service, "chat-prefill"),
                (Kind::Service, "chat-decode"),
                (Kind::Deployment, "chat-router"),
                (Kind::Deployment, "chat-prefill"),
                (Kind::Deployment, "chat-decode"),
                (Kind::PodDisruptionBudget, "chat-router"),
                (Kind::PodDisruptionBudget, "chat-prefill"),
                (Kind::PodDisruptionBudget, "chat-decode"),
                (Kind::ServiceMonitor, "chat"),
                (Kind::InferencePool, "chat"),
            ]
        );
        for d in &objs {
            assert_eq!(d.object["metadata"]["ownerReferences"][0]["uid"], "uid-1");
            assert_eq!(d.object["metadata"]["labels"][SERVICE_LABEL], "chat");
            assert_eq!(d.hash().len(), 24);
            match d.kind {
                Kind::ConfigMap => round_trip::<ConfigMap>(&d.object),
                Kind::Deployment => round_trip::<Deployment>(&d.object),
                Kind::Service => round_trip::<Service>(&d.object),
                Kind::PodDisruptionBudget => round_trip::<PodDisruptionBudget>(&d.object),
                Kind::ServiceMonitor | Kind::InferencePool | Kind::HttpRoute => {}
            }
        }
        let decode = &objs[6].object;
        assert_eq!(decode["spec"]["replicas"], 3);
        let args: Vec<&str> = decode["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.contains(&"--speculative=ngram")
                && args.contains(&"--kv-advertise=$(POD_IP):50062")
                && !args.contains(&"--colocated"),
            "{args:?}"
        );
        let router_args =
            objs[4].object["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(
            router_args.contains("dns:chat-prefill.ml.svc:50051")
                && router_args.contains("dns:chat-decode.ml.svc:50061"),
            "{router_args}"
        );
        assert_eq!(objs[0].object["data"]["TANDEM_REDIS_URL"], "redis://r:6379");
    }

    #[test]
    fn redis_password_and_tls_reach_every_pod() {
        let i = isvc(
            json!({ "prefill": {}, "router": { "redisUrl": "rediss://app@r:6380", "redisPasswordSecret": "redis-auth", "redisTlsSecret": "redis-tls", "redisClientCertificate": true } }),
        );
        let objs = desired(&i, &[]);
        let data = &objs[0].object["data"];
        assert_eq!(data["TANDEM_REDIS_URL"], "rediss://app@r:6380");
        assert_eq!(data["TANDEM_REDIS_CA_CERT"], "/etc/tandem/redis-tls/ca.crt");
        assert_eq!(data["TANDEM_REDIS_CLIENT_CERT"], "/etc/tandem/redis-tls/tls.crt");
        assert_eq!(data["TANDEM_REDIS_CLIENT_KEY"], "/etc/tandem/redis-tls/tls.key");
        let deployments: Vec<_> = objs.iter().filter(|d| d.kind == Kind::Deployment).collect();
        assert_eq!(deployments.len(), 3);
        for d in deployments {
            round_trip::<Deployment>(&d.object);
            let pod = &d.object["spec"]["template"]["spec"];
            let c = &pod["containers"][0];
            let env = c["env"].as_array().unwrap();
            let pw = env.iter().find(|e| e["name"] == "TANDEM_REDIS_PASSWORD").unwrap();
            assert_eq!(
                pw["valueFrom"]["secretKeyRef"],
                json!({ "name": "redis-auth", "key": "password" })
            );
            let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "redis-tls");
            assert_eq!(vol.unwrap()["secret"]["secretName"], "redis-tls", "{}", d.name);
            let mount =
                c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "redis-tls");
            assert_eq!(mount.unwrap()["mountPath"], "/etc/tandem/redis-tls");
        }
    }

    #[test]
    fn security_settings_reach_the_pods() {
        let i = isvc(
            json!({ "prefill": {}, "security": { "apiKeysSecret": "keys", "internalTokenSecret": "internal", "maxConcurrentPerKey": 4, "requestsPerSecondPerKey": 2.5, "maxPromptTokens": 4096, "zeroFreedBlocks": true } }),
        );
        let objs = desired(&i, &[]);
        assert_eq!(objs[0].object["data"]["TANDEM_ZERO_FREED_BLOCKS"], "true");
        for d in objs.iter().filter(|d| d.kind == Kind::Deployment) {
            round_trip::<Deployment>(&d.object);
            let pod = &d.object["spec"]["template"]["spec"];
            let c = &pod["containers"][0];
            let token = c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "TANDEM_INTERNAL_TOKEN")
                .expect("every pod gets the internal token");
            assert_eq!(
                token["valueFrom"]["secretKeyRef"],
                json!({ "name": "internal", "key": "token" })
            );
            let mounts_keys = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["secret"]["secretName"] == "keys");
            let args = c["args"].to_string();
            if d.name == "chat-router" {
                assert!(mounts_keys, "the router mounts the keys");
                for a in [
                    "--api-keys-file=/etc/tandem/api-keys/api-keys",
                    "--max-concurrent-per-key=4",
                    "--requests-per-second-per-key=2.5",
                    "--max-prompt-tokens=4096",
                ] {
                    assert!(args.contains(a), "{a} in {args}");
                }
            } else if d.name == "chat-decode" {
                // Its own OpenAI API (an InferencePool member) takes the same keys.
                assert!(mounts_keys, "the decode workers mount the keys");
                assert!(args.contains("--api-keys-file=/etc/tandem/api-keys/api-keys"), "{args}");
                assert!(!args.contains("per-key"), "{args}");
            } else {
                assert!(!mounts_keys, "prefill workers never see the API keys");
            }
        }
    }

    /// `tensorParallel` reaches each worker as its flag and its GPU request, per role.
    #[test]
    fn tensor_parallel_workers_get_their_gpus_and_flag() {
        let i = isvc(json!({
            "prefill": { "accelerator": "nvidia", "tensorParallel": 1 },
            "decode": { "accelerator": "nvidia", "tensorParallel": 4 },
        }));
        let objs = desired(&i, &[]);
        for (name, gpus) in [("chat-decode", "4"), ("chat-prefill", "1")] {
            let d = objs.iter().find(|d| d.kind == Kind::Deployment && d.name == name).unwrap();
            let c = &d.object["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], gpus, "{name}");
            let args = c["args"].to_string();
            assert!(args.contains(&format!("--tensor-parallel-size={gpus}")), "{name}: {args}");
        }
    }

    #[test]
    fn colocated_gpu_autoscaled_and_config_changes() {
        let mut i = isvc(
            json!({ "decode": { "autoscaling": true, "accelerator": "nvidia" }, "disaggregation": { "mode": "never" } }),
        );
        let objs = desired(&i, &[]);
        assert_eq!(
            objs.len(),
            7,
            "config, 2 services, 2 deployments, 2 pdbs: {:?}",
            objs.iter().map(|d| &d.name).collect::<Vec<_>>()
        );
        let decode =
            objs.iter().find(|d| d.kind == Kind::Deployment && d.name == "chat-decode").unwrap();
        assert!(decode.object["spec"].get("replicas").is_none(), "the autoscaler owns replicas");
        let c = &decode.object["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert!(c["args"].to_string().contains("--colocated"));
        assert!(
            c["args"].to_string().contains("--device=cuda"),
            "a GPU worker runs the model on its GPU"
        );

        // Same spec, same hashes; a config change changes the ConfigMap and the pod templates.
        let again = desired(&i, &[]);
        assert_eq!(objs, again);
        i.spec.kv_transfer.block_size = 32;
        i.spec.decode.speculative =
            Some(SpeculativeSpec { method: SpeculativeMethod::SelfDraft, tokens: 2 });
        let changed = desired(&i, &[]);
        let cm_hash = |o: &[Desired]| {
            o.iter().find(|d| d.kind == Kind::Deployment && d.name == "chat-router").unwrap().object
                ["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(cm_hash(&objs), cm_hash(&changed));
        assert_ne!(objs[0].hash(), changed[0].hash());
    }

    /// The Gateway API Inference Extension objects: the pool selects the decode pods on their
    /// port (which serve the OpenAI API) with the router's Service as endpoint picker; the
    /// route attaches it to the named Gateway; neither without its API.
    #[test]
    fn inference_pool_and_http_route() {
        let i = isvc(json!({
            "prefill": {},
            "router": { "gateway": { "name": "inference-gw", "namespace": "gateways", "sectionName": "http" }, "pickerFailureMode": "FailOpen", "shedWaiting": 8 }
        }));
        let objs = desired(&i, &Kind::ALL);
        let get = |k: Kind| objs.iter().find(|d| d.kind == k).unwrap().object.clone();
        let pool = get(Kind::InferencePool);
        assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
        assert_eq!(
            pool["spec"]["selector"]["matchLabels"],
            json!(role_selector_labels(&i, Role::Decode))
        );
        assert_eq!(pool["spec"]["targetPorts"], json!([{ "number": DECODE_PORT }]));
        assert_eq!(
            pool["spec"]["endpointPickerRef"],
            json!({ "kind": "Service", "name": "chat", "port": { "number": EPP_PORT }, "failureMode": "FailOpen" })
        );
        let route = get(Kind::HttpRoute);
        assert_eq!(route["apiVersion"], "gateway.networking.k8s.io/v1");
        assert_eq!(
            route["spec"]["parentRefs"],
            json!([{ "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw", "namespace": "gateways", "sectionName": "http" }])
        );
        assert_eq!(
            route["spec"]["rules"][0]["backendRefs"],
            json!([{ "group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat" }])
        );
        assert_eq!(route["spec"]["rules"][0]["timeouts"], json!({ "request": "600s" }));
        // The picker's port on the router's Service and pods; the workers serve the API.
        let svc: Service = serde_json::from_value(get(Kind::Service)).unwrap();
        let ports = svc.spec.unwrap().ports.unwrap();
        assert!(ports.iter().any(|p| p.name.as_deref() == Some("epp") && p.port == EPP_PORT));
        let router = container_args(&i, Role::Router);
        assert!(
            router.contains(&format!("--epp-listen=0.0.0.0:{EPP_PORT}"))
                && router.contains(&"--epp-shed-waiting=8".to_string()),
            "{router:?}"
        );
        let decode = container_args(&i, Role::Decode);
        assert!(decode.contains(&"--serve-openai".to_string()), "{decode:?}");
        assert!(
            decode.iter().any(|a| a == "--prefill-workers=dns:chat-prefill.ml.svc:50051"),
            "{decode:?}"
        );
        // Without the APIs, neither; without a gateway, the pool only.
        let none = desired(&i, &[]);
        assert!(none.iter().all(|d| !matches!(d.kind, Kind::InferencePool | Kind::HttpRoute)));
        let plain = isvc(json!({}));
        let kinds: Vec<Kind> = desired(&plain, &Kind::ALL).iter().map(|d| d.kind).collect();
        assert!(kinds.contains(&Kind::InferencePool) && !kinds.contains(&Kind::HttpRoute));
    }

    #[test]
    fn model_uri_and_pod_overrides_reach_the_pods() {
        let i = isvc(json!({
            "model": { "uri": "pvc://llm-models/gemma/q4_k_m.gguf", "name": "gemma" },
            "router": { "redisUrl": "rediss://r", "redisTlsSecret": "t", "redisClientCertificate": true },
            "security": { "zeroFreedBlocks": true },
            "decode": { "pod": {
                "nodeSelector": { "gpu": "h100" },
                "tolerations": [{ "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule" }],
                "priorityClassName": "inference",
                "imagePullSecrets": [{ "name": "registry" }],
                "env": [{ "name": "TANDEM_CPU_KERNEL", "value": "avx2" }],
                "volumes": [{ "name": "scratch", "emptyDir": {} }],
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }],
                "labels": { "team": "ml" },
                "annotations": { "example.com/owner": "ml" }
            } }
        }));
        let config = config_data(&i);
        assert_eq!(config["TANDEM_MODEL"], "/models/gemma/q4_k_m.gguf");
        // Every optional setting is set here: the list the pod overrides are checked against is
        // exactly what the ConfigMap can hold.
        let keys: Vec<&str> = config.keys().map(String::as_str).collect();
        assert_eq!(keys, CONFIG_KEYS, "keep CONFIG_KEYS (sorted) equal to config_data's keys");
        let dep = |role| deployment(&i, role, "h");
        let d = dep(Role::Decode);
        let pod = d.spec.template;
        let spec = pod.spec.unwrap();
        let claims: Vec<String> = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
            .collect();
        assert_eq!(claims, ["llm-models"]);
        assert_eq!(spec.node_selector.unwrap()["gpu"], "h100");
        assert_eq!(spec.tolerations.unwrap()[0].key.as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("inference"));
        assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "registry");
        let c = &spec.containers[0];
        assert!(c.env.iter().flatten().any(|e| e.name == "TANDEM_CPU_KERNEL"));
        assert!(c.volume_mounts.iter().flatten().any(|m| m.mount_path == "/scratch"));
        assert!(spec.volumes.iter().flatten().any(|v| v.name == "scratch"));
        let meta = pod.metadata.unwrap();
        assert_eq!(meta.labels.unwrap()["team"], "ml");
        let ann = meta.annotations.unwrap();
        assert_eq!(
            (ann["example.com/owner"].as_str(), ann[CONFIG_HASH_ANNOTATION].as_str()),
            ("ml", "h")
        );
        // Only the role that asked gets them.
        let r = dep(Role::Router).spec.template.spec.unwrap();
        assert!(r.node_selector.is_none() && r.tolerations.is_none());
        assert!(
            crate::validate::problems(&i.spec).is_empty(),
            "{:?}",
            crate::validate::problems(&i.spec)
        );
    }

    #[test]
    fn nccl_transfers_reach_both_gpu_worker_roles() {
        let i = isvc(
            json!({ "prefill": { "accelerator": "nvidia" }, "decode": { "accelerator": "nvidia" }, "kvTransfer": { "backend": "nccl" } }),
        );
        assert!(
            crate::validate::problems(&i.spec).is_empty(),
            "{:?}",
            crate::validate::problems(&i.spec)
        );
        assert_eq!(config_data(&i)["TANDEM_KV_TRANSPORT"], "nccl");
        for role in [Role::Prefill, Role::Decode] {
            let args = container_args(&i, role);
            assert!(args.contains(&"--device=cuda".to_string()), "{role:?}: {args:?}");
        }
        let cpu = isvc(json!({ "prefill": {}, "decode": {} }));
        assert_eq!(config_data(&cpu)["TANDEM_KV_TRANSPORT"], "tcp");
        assert!(!container_args(&cpu, Role::Decode).contains(&"--device=cuda".to_string()));
    }
}
