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
pub use pods::GPU_MALLOC_TUNABLES;

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
mod tests;
