//! The `InferenceService` custom resource (`tandem.dev/v1alpha1`): what a user applies, and the
//! status the operator reports back.
//!
//! The CRD is generated from these types ([`crd_yaml`]) and committed under
//! `charts/tandem/crds/`; the schema carries the validation the API server enforces (positive
//! replicas, known enums, decode tensor parallelism at least prefill's), and
//! [`crate::validate`] repeats the checks in the operator for API servers that skip CEL rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration, Volume, VolumeMount,
};
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
    validation = Rule::new("!self.router.redisClientCertificate || has(self.router.redisTlsSecret)").message("redisClientCertificate needs redisTlsSecret"),
    validation = Rule::new("!has(self.router.gateway) || self.router.inferencePool").message("router.gateway needs router.inferencePool (the route's backend)")
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
#[x_kube(validation = Rule::new("!has(self.uri) || (!has(self.path) && !has(self.pvc))").message("give model.uri, or model.path (and pvc), not both"))]
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
    /// The model as a URI, instead of `path` and `pvc`: `pvc://<claim>/<path in the claim>`
    /// (mounted read-only at `/models`) or `file:///<path in the image>`. Tandem fetches no
    /// model from a hub or object store (`hf://`, `s3://`, `gs://`, `https://`, `oci://` are
    /// refused): copy the file onto a PersistentVolumeClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[^/].*|file:///[^/].*)$')").message("model uri must be pvc://<claim>/<path> or file:///<path>: Tandem fetches no model from a hub or object store"))]
    pub uri: Option<String>,
}

impl ModelSpec {
    /// The model's path inside the containers and the claim to mount for it, from `uri` or
    /// from `path` and `pvc` (None, None: the embedded default model).
    pub fn source(&self) -> (Option<String>, Option<String>) {
        match self.uri.as_deref() {
            Some(uri) => {
                if let Some(rest) = uri.strip_prefix("pvc://") {
                    let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
                    (Some(format!("/models/{path}")), Some(claim.to_string()))
                } else {
                    (uri.strip_prefix("file://").map(str::to_string), None)
                }
            }
            None => (self.path.clone(), self.pvc.clone()),
        }
    }
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
    /// What the router's pods get beyond what the operator sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
    /// Create an `InferencePool` of the decode workers, with the router as its endpoint picker
    /// (when the cluster has the Gateway API Inference Extension's API).
    #[serde(default = "yes")]
    pub inference_pool: bool,
    /// Attach the service to this Gateway (Gateway API): an `HTTPRoute` whose backend is the
    /// service's `InferencePool` (decode workers as model servers, the router as their
    /// endpoint picker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayRef>,
    /// What a gateway does with a request when the endpoint picker does not answer.
    #[serde(default)]
    pub picker_failure_mode: PickerFailureMode,
    /// The endpoint picker sheds a request (429) while every decode worker has at least this
    /// many sequences waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub shed_waiting: Option<i32>,
}

/// A Gateway (`gateway.networking.k8s.io`) to attach to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRef {
    /// The Gateway's name.
    pub name: String,
    /// Its namespace (default: the InferenceService's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The listener of the Gateway to attach to (default: every one that allows the route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The route's request timeout, in seconds: a generation streams for as long as it runs
    /// (gateways' own defaults, such as Envoy's 15 s, would cut it).
    #[serde(default = "default_route_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub request_timeout_seconds: i32,
}

fn default_route_timeout() -> i32 {
    600
}

/// `InferencePool.spec.endpointPickerRef.failureMode`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PickerFailureMode {
    /// The gateway drops the request.
    #[default]
    FailClose,
    /// The gateway sends the request to an endpoint of its own choosing.
    FailOpen,
}

/// What a role's pods get beyond what the operator sets: scheduling, pull secrets, extra
/// environment, volumes, labels and annotations. Names the operator uses itself are refused
/// (see [`crate::validate`]) rather than silently shadowed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the pods tolerate (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod (anti-)affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// The pods' PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The pods' ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets for pulling `image` from a private registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// More environment variables of the container (e.g. `TANDEM_CPU_KERNEL`, `RUST_LOG`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// More volumes of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// Where the container mounts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// More labels of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// More annotations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
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
            pod: None,
            inference_pool: true,
            gateway: None,
            picker_failure_mode: PickerFailureMode::default(),
            shed_waiting: None,
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
    /// GPUs per worker (tensor parallelism, `accelerator: nvidia`): the worker splits the model's
    /// heads, MLP and KV blocks across this many GPUs of its node (`--tensor-parallel-size`),
    /// which must divide the model's query heads and divide its KV heads or be a multiple of
    /// their count (each then replicated). Workers of different sizes exchange KV pages over
    /// `kvTransfer.backend: tcp` (re-sharded by KV head).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 8))]
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
    /// What the workers' pods get beyond what the operator sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
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
            pod: None,
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
    let mut crd = serde_json::to_value(InferenceService::crd()).expect("CRD serializes");
    for version in crd["spec"]["versions"].as_array_mut().into_iter().flatten() {
        let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for role in ["router", "prefill", "decode"] {
            let pod = &mut spec[role]["properties"]["pod"]["properties"];
            for field in pod.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                for inner in field.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                    drop_descriptions(inner);
                }
            }
        }
    }
    format!(
        "# Generated by `tandem-operator crd` from operator/src/crd.rs; do not edit.\n{}",
        serde_yaml::to_string(&sorted(crd)).expect("CRD serializes")
    )
}

/// Removes every `description` below `v`: the Kubernetes types a pod override embeds (affinity,
/// volumes, tolerations, …) carry their whole API documentation, which would make the CRD
/// ten times larger (too large for `kubectl apply`'s last-applied annotation) three times
/// over. Their fields keep their own descriptions.
fn drop_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("description");
            m.values_mut().for_each(drop_descriptions);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_descriptions),
        _ => {}
    }
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
