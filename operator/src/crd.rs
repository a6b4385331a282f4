//! The `InferenceService` custom resource (`tandem.dev/v1alpha1`): what a user applies, and the
//! status the operator reports back.
//!
//! The CRD is generated from these types ([`crd_yaml`]) and committed under
//! `charts/tandem/crds/`; the schema carries the validation the API server enforces (positive
//! replicas, known enums, decode tensor parallelism at least prefill's), and
//! [`crate::validate`] repeats the checks in the operator for API servers that skip CEL rules.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of one served model: a router, optional prefill workers and decode workers.
// `printcolumn` is meant to repeat (one per column).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "InferenceService",
    plural = "inferenceservices",
    shortname = "tis",
    category = "tandem",
    namespaced,
    status = "InferenceServiceStatus",
    doc = "A Tandem deployment of one model: an OpenAI-compatible router with prefill and decode workers.",
    scale(
        spec_replicas_path = ".spec.decode.replicas",
        status_replicas_path = ".status.decode.replicas",
        label_selector_path = ".status.decode.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Prefill", type_ = "integer", json_path = ".status.prefill.readyReplicas"),
    printcolumn(name = "Decode", type_ = "integer", json_path = ".status.decode.readyReplicas"),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoint",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new("!has(self.prefill) || self.decode.tensorParallel >= self.prefill.tensorParallel").message("decode tensorParallel must be at least prefill tensorParallel"),
    validation = Rule::new("self.disaggregation.mode != 'always' || has(self.prefill)").message("disaggregation mode 'always' needs prefill workers"),
    validation = Rule::new("self.kvTransfer.backend != 'nccl' || (self.decode.accelerator == 'nvidia' && (!has(self.prefill) || self.prefill.accelerator == 'nvidia'))").message("the nccl KV transfer backend needs accelerator 'nvidia' on every worker role"),
    validation = Rule::new("!has(self.prefill) || !has(self.prefill.speculative)").message("speculative decoding is a decode setting"),
    validation = Rule::new("(!has(self.router.redisTlsSecret) && !has(self.router.redisPasswordSecret)) || has(self.router.redisUrl)").message("redisPasswordSecret and redisTlsSecret need redisUrl"),
    validation = Rule::new("!has(self.router.redisTlsSecret) || self.router.redisUrl.startsWith('rediss://')").message("redisTlsSecret needs a rediss:// redisUrl"),
    validation = Rule::new("!self.router.redisClientCertificate || has(self.router.redisTlsSecret)").message("redisClientCertificate needs redisTlsSecret")
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceServiceSpec {
    /// The model to serve.
    #[serde(default)]
    pub model: ModelSpec,
    /// Container image holding the `tandem` binary.
    #[serde(default = "default_image")]
    pub image: String,
    /// Image pull policy of every container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// The OpenAI-compatible gateway.
    #[serde(default)]
    pub router: RouterSpec,
    /// Prefill workers. Without them the decode workers prefill their own prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<WorkerSpec>,
    /// Decode workers.
    #[serde(default)]
    pub decode: WorkerSpec,
    /// How KV pages move from prefill to decode workers.
    #[serde(default)]
    pub kv_transfer: KvTransferSpec,
    /// When a prompt is prefilled remotely.
    #[serde(default)]
    pub disaggregation: DisaggregationSpec,
    /// Prometheus scraping.
    #[serde(default)]
    pub monitoring: MonitoringSpec,
    /// API keys, limits, internal authentication, KV zeroing.
    #[serde(default)]
    pub security: SecuritySpec,
}

/// The image the chart's version ships.
pub fn default_image() -> String {
    format!("ghcr.io/tandem-serving/tandem:{}", env!("CARGO_PKG_VERSION"))
}

/// Image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// Which model, from where.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Name served on `/v1/models` (default: the model's own name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Path of the GGUF or safetensors model inside the container. Without it the workers fetch
    /// the embedded default model (SmolLM2-135M-Instruct) into their cache volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("model path must be absolute"))]
    pub path: Option<String>,
    /// A PersistentVolumeClaim mounted read-only at `/models` on every pod (for `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<String>,
}

/// The router's settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    /// Router replicas (they share routing state through Redis when `redisUrl` is set).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: i32,
    /// How workers are chosen.
    #[serde(default)]
    pub policy: RoutingPolicy,
    /// Weight of the prefill term of the routing cost.
    #[serde(default = "default_overlap_weight")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub overlap_weight: f64,
    /// Weight of the decode term of the routing cost.
    #[serde(default = "default_decode_weight")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub decode_weight: f64,
    /// Redis (`redis://[user@]host:port[/db]`, or `rediss://` for TLS) for KV events and load
    /// shared among routers. No password here: see `redisPasswordSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^rediss?://') && !self.matches('^rediss?://[^/@]*:[^/@]*@')").message("redisUrl must start with redis:// or rediss:// and hold no password (use redisPasswordSecret)"))]
    pub redis_url: Option<String>,
    /// Secret holding the Redis password under `password` (the ACL user, if any, is named in
    /// `redisUrl`); every router and worker reads it as `TANDEM_REDIS_PASSWORD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_password_secret: Option<String>,
    /// Secret with the CA that signed the Redis server's certificate under `ca.crt` (and, with
    /// `redisClientCertificate`, a client certificate under `tls.crt` and `tls.key`: the layout
    /// of cert-manager's and `kubernetes.io/tls` Secrets), mounted at `/etc/tandem/redis-tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_tls_secret: Option<String>,
    /// Present the client certificate of `redisTlsSecret` (Redis with `tls-auth-clients yes`).
    #[serde(default)]
    pub redis_client_certificate: bool,
    /// Kubernetes Service type of the router's Service.
    #[serde(default)]
    pub service_type: ServiceType,
    /// Router container resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

impl Default for RouterSpec {
    fn default() -> Self {
        RouterSpec {
            replicas: 1,
            policy: RoutingPolicy::default(),
            overlap_weight: default_overlap_weight(),
            decode_weight: default_decode_weight(),
            redis_url: None,
            redis_password_secret: None,
            redis_tls_secret: None,
            redis_client_certificate: false,
            service_type: ServiceType::default(),
            resources: None,
        }
    }
}

fn one() -> i32 {
    1
}
fn default_overlap_weight() -> f64 {
    1.0
}
fn default_decode_weight() -> f64 {
    0.1
}

/// Routing policy (the router's `--routing-policy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingPolicy {
    /// Longest cached prefix weighed against load.
    #[default]
    Kv,
    /// In turn.
    RoundRobin,
    /// Least booked load.
    LeastLoaded,
}

impl RoutingPolicy {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingPolicy::Kv => "kv",
            RoutingPolicy::RoundRobin => "round-robin",
            RoutingPolicy::LeastLoaded => "least-loaded",
        }
    }
}

/// Service type of the router's Service.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ServiceType {
    /// Reachable inside the cluster.
    #[default]
    ClusterIP,
    /// On every node's port.
    NodePort,
    /// Through the cloud's load balancer.
    LoadBalancer,
}

/// One worker role (prefill or decode).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSpec {
    /// Worker replicas. Leave it to an autoscaler with `autoscaling: true`.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1024))]
    pub replicas: i32,
    /// When true the operator does not set the Deployment's replicas: an autoscaler (HPA, KEDA)
    /// owns them through the Deployment's scale subresource.
    #[serde(default)]
    pub autoscaling: bool,
    /// GPUs per worker (tensor parallelism). Only 1 until the workers shard a model across
    /// GPUs: a larger value would request GPUs that sit idle, so it is refused.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1))]
    pub tensor_parallel: i32,
    /// Where the worker computes.
    #[serde(default)]
    pub accelerator: Accelerator,
    /// Container resources (GPUs are added from `accelerator` and `tensorParallel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Most tokens one engine step computes (chunked-prefill budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 65536))]
    pub max_num_batched_tokens: Option<i32>,
    /// Most sequences in one batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_num_seqs: Option<i32>,
    /// Speculative decoding (decode workers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeSpec>,
    /// Seconds a terminating worker gets to finish its requests (graceful drain on scale-down).
    #[serde(default = "default_drain")]
    #[schemars(range(min = 0, max = 3600))]
    pub drain_seconds: i32,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        WorkerSpec {
            replicas: 1,
            autoscaling: false,
            tensor_parallel: 1,
            accelerator: Accelerator::default(),
            resources: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            speculative: None,
            drain_seconds: default_drain(),
        }
    }
}

fn default_drain() -> i32 {
    60
}

/// Where a worker computes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    /// CPU cores.
    #[default]
    Cpu,
    /// NVIDIA GPUs (`nvidia.com/gpu` resources).
    Nvidia,
}

/// Speculative decoding settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpeculativeSpec {
    /// How drafts are proposed.
    pub method: SpeculativeMethod,
    /// Most draft tokens per step.
    #[serde(default = "default_spec_tokens")]
    #[schemars(range(min = 1, max = 16))]
    pub tokens: i32,
}

fn default_spec_tokens() -> i32 {
    4
}

/// Draft proposer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SpeculativeMethod {
    /// Prompt lookup (n-gram matches in the context).
    Ngram,
    /// The model's first layers as the draft.
    SelfDraft,
}

impl SpeculativeMethod {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculativeMethod::Ngram => "ngram",
            SpeculativeMethod::SelfDraft => "self-draft",
        }
    }
}

/// KV page transport between prefill and decode workers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvTransferSpec {
    /// Transport.
    #[serde(default)]
    pub backend: KvBackend,
    /// Tokens per KV block; every worker uses the same size.
    #[serde(default = "default_block_size")]
    #[x_kube(validation = Rule::new("self in [8, 16, 32, 64, 128]").message("blockSize must be one of 8, 16, 32, 64, 128"))]
    pub block_size: i32,
    /// Seconds without progress after which a transfer has failed.
    #[serde(default = "default_transfer_timeout")]
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: i32,
    /// What a failed transfer does to its request.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
}

impl Default for KvTransferSpec {
    fn default() -> Self {
        KvTransferSpec {
            backend: KvBackend::default(),
            block_size: default_block_size(),
            timeout_seconds: default_transfer_timeout(),
            failure_policy: FailurePolicy::default(),
        }
    }
}

fn default_block_size() -> i32 {
    16
}
fn default_transfer_timeout() -> i32 {
    2
}

/// KV transfer transport.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KvBackend {
    /// TCP between hosts (CPU workers).
    #[default]
    Tcp,
    /// NCCL between GPUs.
    Nccl,
}

impl KvBackend {
    /// The workers' `--kv-transport` value.
    pub fn as_str(self) -> &'static str {
        match self {
            KvBackend::Tcp => "tcp",
            KvBackend::Nccl => "nccl",
        }
    }
}

/// What a failed KV transfer does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// The decode worker prefills the prompt itself.
    #[default]
    Recompute,
    /// The request fails with an error.
    Fail,
}

impl FailurePolicy {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Recompute => "recompute",
            FailurePolicy::Fail => "fail",
        }
    }
}

/// When prompts are prefilled on prefill workers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisaggregationSpec {
    /// `conditional`: remote only when the uncached part is at least `minTokens`.
    #[serde(default)]
    pub mode: DisaggregationMode,
    /// Uncached prompt tokens below which the decode worker prefills itself (`conditional`).
    #[serde(default = "default_min_tokens")]
    #[schemars(range(min = 1, max = 1048576))]
    pub min_tokens: i32,
}

impl Default for DisaggregationSpec {
    fn default() -> Self {
        DisaggregationSpec { mode: DisaggregationMode::default(), min_tokens: default_min_tokens() }
    }
}

fn default_min_tokens() -> i32 {
    16
}

/// Disaggregation mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DisaggregationMode {
    /// Every prompt with an uncached block goes to a prefill worker.
    Always,
    /// Long uncached prompts go to a prefill worker.
    #[default]
    Conditional,
    /// Decode workers prefill everything (prefill workers are not used).
    Never,
}

/// Prometheus scraping.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Create a ServiceMonitor (when the cluster has the Prometheus Operator's API).
    #[serde(default = "yes")]
    pub service_monitor: bool,
}

impl Default for MonitoringSpec {
    fn default() -> Self {
        MonitoringSpec { service_monitor: true }
    }
}

fn yes() -> bool {
    true
}

/// Access control and isolation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecuritySpec {
    /// Secret with the API keys under `api-keys` (one `KEY` or `KEY:TENANT` per line; tenants
    /// never share cached prefixes). Without it the OpenAI API is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys_secret: Option<String>,
    /// Secret with the shared secret of the internal gRPC calls under `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_token_secret: Option<String>,
    /// Most requests of one key in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_concurrent_per_key: Option<i32>,
    /// Requests per second one key may send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 100000.0))]
    pub requests_per_second_per_key: Option<f64>,
    /// Longest prompt accepted, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_prompt_tokens: Option<i32>,
    /// Zero KV blocks as soon as they are freed (no prefix reuse across time).
    #[serde(default)]
    pub zero_freed_blocks: bool,
}

/// Where the router reads the API keys file.
pub const API_KEYS_DIR: &str = "/etc/tandem/api-keys";

/// Where the Secret of `router.redisTlsSecret` is mounted.
pub const REDIS_TLS_DIR: &str = "/etc/tandem/redis-tls";

/// What the operator observed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceServiceStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The router's replicas.
    #[serde(default)]
    pub router: RoleStatus,
    /// The prefill workers' replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<RoleStatus>,
    /// The decode workers' replicas.
    #[serde(default)]
    pub decode: RoleStatus,
    /// `Ready`, `WorkloadsReady`, `RouterReady`, `Progressing`, `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The OpenAI base URL inside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Replica counts of one role's Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// Desired replicas.
    pub replicas: i32,
    /// Replicas running the current pod template.
    pub updated_replicas: i32,
    /// Ready replicas (any template).
    pub ready_replicas: i32,
    /// Available replicas (any template).
    pub available_replicas: i32,
    /// Label selector of the role's pods (for the scale subresource).
    pub selector: String,
}

/// The CRD as YAML, as committed under `charts/tandem/crds/`: every mapping's keys sorted, so
/// the text does not depend on whether a build enables `serde_json`'s `preserve_order` (a
/// workspace build does, through other crates; this crate alone does not).
pub fn crd_yaml() -> String {
    let crd = serde_json::to_value(InferenceService::crd()).expect("CRD serializes");
    format!(
        "# Generated by `tandem-operator crd` from operator/src/crd.rs; do not edit.\n{}",
        serde_yaml::to_string(&sorted(crd)).expect("CRD serializes")
    )
}

/// `v` with every object's keys in sorted order, whatever map type `serde_json` was built with.
pub fn sorted(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<(String, serde_json::Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sorted).collect())
        }
        other => other,
    }
}
