//! The Deployment of each role: its pod template (container arguments, environment, probes,
//! volumes, resources) as `k8s-openapi` types.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar,
    EnvVarSource, HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SecretKeySelector, SecretVolumeSource, SleepAction, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{
    meta, role_name, role_selector_labels, uses_prefill, Role, CACHE_DIR, CONFIG_HASH_ANNOTATION,
    DECODE_PORT, EPP_PORT, KV_PORT, PREFILL_PORT, ROUTER_PORT,
};
use crate::crd::{Accelerator, InferenceService, PodOverrides, WorkerSpec};

/// DNS name of a role's headless Service.
fn worker_dns(isvc: &InferenceService, role: Role) -> String {
    format!(
        "{}.{}.svc",
        role_name(isvc, role),
        isvc.namespace().unwrap_or_else(|| "default".into())
    )
}

pub(super) fn container_args(isvc: &InferenceService, role: Role) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    match role {
        Role::Router => {
            a.push("router".into());
            a.push(format!("--listen=0.0.0.0:{ROUTER_PORT}"));
            a.push(format!(
                "--decode-workers=dns:{}:{DECODE_PORT}",
                worker_dns(isvc, Role::Decode)
            ));
            if uses_prefill(isvc) {
                a.push(format!(
                    "--prefill-workers=dns:{}:{PREFILL_PORT}",
                    worker_dns(isvc, Role::Prefill)
                ));
            }
            a.push("--router-id=$(POD_NAME)".into());
            // The endpoint picker of the service's InferencePool (idle without a gateway).
            a.push(format!("--epp-listen=0.0.0.0:{EPP_PORT}"));
            if let Some(n) = isvc.spec.router.shed_waiting {
                a.push(format!("--epp-shed-waiting={n}"));
            }
            let sec = &isvc.spec.security;
            if sec.api_keys_secret.is_some() {
                a.push(format!("--api-keys-file={}/api-keys", crate::crd::API_KEYS_DIR));
            }
            if let Some(n) = sec.max_concurrent_per_key {
                a.push(format!("--max-concurrent-per-key={n}"));
            }
            if let Some(r) = sec.requests_per_second_per_key {
                a.push(format!("--requests-per-second-per-key={r}"));
            }
            if let Some(n) = sec.max_prompt_tokens {
                a.push(format!("--max-prompt-tokens={n}"));
            }
        }
        Role::Prefill | Role::Decode => {
            let w = worker_spec(isvc, role);
            if role == Role::Prefill {
                a.push("prefill".into());
                a.push(format!("--listen=0.0.0.0:{PREFILL_PORT}"));
            } else {
                a.push("decode".into());
                a.push(format!("--listen=0.0.0.0:{DECODE_PORT}"));
                a.push(format!("--kv-listen=0.0.0.0:{KV_PORT}"));
                a.push(format!("--kv-advertise=$(POD_IP):{KV_PORT}"));
                if !uses_prefill(isvc) {
                    a.push("--colocated".into());
                }
                // A model server of the InferencePool: the OpenAI API on the worker's port.
                a.push("--serve-openai".into());
                if isvc.spec.security.api_keys_secret.is_some() {
                    a.push(format!("--api-keys-file={}/api-keys", crate::crd::API_KEYS_DIR));
                }
                if uses_prefill(isvc) {
                    a.push(format!(
                        "--prefill-workers=dns:{}:{PREFILL_PORT}",
                        worker_dns(isvc, Role::Prefill)
                    ));
                }
                if let Some(spec) = &w.speculative {
                    a.push(format!("--speculative={}", spec.method.as_str()));
                    a.push(format!("--num-speculative-tokens={}", spec.tokens));
                }
            }
            if w.accelerator == Accelerator::Nvidia {
                a.push("--device=cuda".into());
                a.push(format!("--tensor-parallel-size={}", w.tensor_parallel));
            }
            a.push("--worker-id=$(POD_NAME)".into());
            a.push(format!("--drain-timeout={}s", w.drain_seconds));
            if let Some(n) = w.max_num_batched_tokens {
                a.push(format!("--max-num-batched-tokens={n}"));
            }
            if let Some(n) = w.max_num_seqs {
                a.push(format!("--max-num-seqs={n}"));
            }
        }
    }
    a
}

/// What the spec adds to `role`'s pods.
pub(super) fn pod_overrides(isvc: &InferenceService, role: Role) -> Option<&PodOverrides> {
    match role {
        Role::Router => isvc.spec.router.pod.as_ref(),
        Role::Prefill => isvc.spec.prefill.as_ref().and_then(|w| w.pod.as_ref()),
        Role::Decode => isvc.spec.decode.pod.as_ref(),
    }
}

fn worker_spec(isvc: &InferenceService, role: Role) -> &WorkerSpec {
    match role {
        Role::Prefill => isvc.spec.prefill.as_ref().expect("prefill role exists"),
        _ => &isvc.spec.decode,
    }
}

fn resources(isvc: &InferenceService, role: Role) -> ResourceRequirements {
    let (res, gpus) = match role {
        Role::Router => (isvc.spec.router.resources.clone(), 0),
        _ => {
            let w = worker_spec(isvc, role);
            (
                w.resources.clone(),
                if w.accelerator == Accelerator::Nvidia { w.tensor_parallel } else { 0 },
            )
        }
    };
    let mut r = res.unwrap_or_default();
    if gpus > 0 {
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert("nvidia.com/gpu".into(), Quantity(gpus.to_string()));
    }
    r
}

/// glibc's per-thread cache of freed blocks for the services on a GPU host (`tandem up --device
/// cuda` gives it to every service; the operator to GPU worker pods whose `env` does not set
/// `GLIBC_TUNABLES`): 1,024 entries a size instead of 7. A step's outputs are allocated on the
/// engine thread and freed on the runtime's threads; with 7-entry caches those frees overflow
/// into the engine thread's arena under its lock. On one H100 host whose engine thread ran slow
/// (served rounds of 2,048 requests at 256 streams, alternating), the decode worker's outputs
/// phase went from 581 / 486 to 175 / 272 µs a step and served / engine from 80 / 82 to 89 / 83 %
/// with every core, 72 to 76 % on four cores (docs/gpu-runs/h100-2026-12-07c-split-rule/4-k134/).
/// Bounded: at most 1,024 blocks of each size up to 1,032 bytes a thread. Other C libraries
/// ignore it.
pub const GPU_MALLOC_TUNABLES: &str = "glibc.malloc.tcache_count=1024";

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn secret_volume(name: &str, secret: &str, mount: &str) -> (Volume, VolumeMount) {
    let vol = Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o400),
            ..Default::default()
        }),
        ..Default::default()
    };
    (
        vol,
        VolumeMount {
            name: name.into(),
            mount_path: mount.into(),
            read_only: Some(true),
            ..Default::default()
        },
    )
}

/// An HTTP GET of `/health` on the named port, every `period` s, `failures` times before it counts.
fn health_probe(port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::String(port.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

pub(super) fn deployment(isvc: &InferenceService, role: Role, config_hash: &str) -> Deployment {
    let s = &isvc.spec;
    let match_labels = role_selector_labels(isvc, role);
    let (port_name, port, drain) = match role {
        Role::Router => ("http", ROUTER_PORT, 10),
        Role::Prefill => ("grpc", PREFILL_PORT, worker_spec(isvc, role).drain_seconds),
        Role::Decode => ("grpc", DECODE_PORT, worker_spec(isvc, role).drain_seconds),
    };
    let container_port = |name: &str, port| ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let mut ports = vec![container_port(port_name, port)];
    if role == Role::Decode {
        ports.push(container_port("kv", KV_PORT));
    }
    if role == Role::Router {
        ports.push(container_port("epp", EPP_PORT));
    }
    let mut env =
        vec![env_from_field("POD_NAME", "metadata.name"), env_from_field("POD_IP", "status.podIP")];
    if let Some(secret) = &s.security.internal_token_secret {
        env.push(env_from_secret("TANDEM_INTERNAL_TOKEN", secret, "token"));
    }
    if let Some(secret) = &s.router.redis_password_secret {
        env.push(env_from_secret("TANDEM_REDIS_PASSWORD", secret, "password"));
    }
    let mut volumes = vec![Volume {
        name: "cache".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "cache".into(),
        mount_path: CACHE_DIR.into(),
        ..Default::default()
    }];
    if let Some(secret) = &s.router.redis_tls_secret {
        // Routers read KV events and workers publish them: every role talks to Redis.
        let (v, m) = secret_volume("redis-tls", secret, crate::crd::REDIS_TLS_DIR);
        volumes.push(v);
        mounts.push(m);
    }
    // The router's API and the decode workers' own (`--serve-openai`) take the same keys.
    if let (Role::Router | Role::Decode, Some(secret)) = (role, &s.security.api_keys_secret) {
        let (v, m) = secret_volume("api-keys", secret, crate::crd::API_KEYS_DIR);
        volumes.push(v);
        mounts.push(m);
    }
    if let (_, Some(pvc)) = &s.model.source() {
        volumes.push(Volume {
            name: "models".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "models".into(),
            mount_path: "/models".into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let extra = pod_overrides(isvc, role).cloned().unwrap_or_default();
    let user_sets = |name: &str| extra.env.iter().flatten().any(|e| e.name == name);
    if role != Role::Router
        && worker_spec(isvc, role).accelerator == Accelerator::Nvidia
        && !user_sets("GLIBC_TUNABLES")
    {
        env.push(EnvVar {
            name: "GLIBC_TUNABLES".into(),
            value: Some(GPU_MALLOC_TUNABLES.into()),
            ..Default::default()
        });
    }
    env.extend(extra.env.iter().flatten().cloned());
    volumes.extend(extra.volumes.iter().flatten().cloned());
    mounts.extend(extra.volume_mounts.iter().flatten().cloned());
    let (startup, liveness) = if role == Role::Router {
        // A router without workers is unready, not dead: liveness checks only the listener.
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String(port_name.into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            failure_threshold: Some(3),
            ..Default::default()
        };
        (None, tcp)
    } else {
        // Model fetch and load happen before the first answer.
        (Some(health_probe(port_name, 5, 120)), health_probe(port_name, 10, 3))
    };
    let container = Container {
        name: role.as_str().into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(container_args(isvc, role)),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: format!("{}-config", isvc.name_any()),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        env: Some(env),
        ports: Some(ports),
        resources: Some(resources(isvc, role)),
        // Ready only while the process can serve: the router while a decode worker answers,
        // a worker while its engine thread runs and its last step succeeded.
        readiness_probe: Some(health_probe(port_name, 5, 2)),
        startup_probe: startup,
        liveness_probe: Some(liveness),
        // Lets endpoints and routers drop the pod before SIGTERM starts the drain.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: 5 }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut pod_labels = match_labels.clone();
    pod_labels.insert("app.kubernetes.io/name".into(), "tandem".into());
    pod_labels.extend(extra.labels.clone().unwrap_or_default());
    let mut annotations = extra.annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    let replicas = match role {
        Role::Router => Some(s.router.replicas),
        _ => {
            let w = worker_spec(isvc, role);
            (!w.autoscaling).then_some(w.replicas)
        }
    };
    Deployment {
        metadata: meta(role_name(isvc, role), Some(role)),
        spec: DeploymentSpec {
            replicas,
            selector: LabelSelector { match_labels: Some(match_labels), ..Default::default() },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    termination_grace_period_seconds: Some(i64::from(drain) + 15),
                    containers: vec![container],
                    volumes: Some(volumes),
                    node_selector: extra.node_selector,
                    tolerations: extra.tolerations,
                    affinity: extra.affinity,
                    priority_class_name: extra.priority_class_name,
                    service_account_name: extra.service_account_name,
                    image_pull_secrets: extra.image_pull_secrets,
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}
