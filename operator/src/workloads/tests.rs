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
        let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "redis-tls");
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
        let mounts_keys =
            pod["volumes"].as_array().unwrap().iter().any(|v| v["secret"]["secretName"] == "keys");
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

/// GPU workers get glibc's deeper thread cache unless their pod sets `GLIBC_TUNABLES`; CPU
/// workers and the router do not.
#[test]
fn gpu_workers_get_the_malloc_cache_unless_their_pod_sets_it() {
    let env_of = |objs: &[Desired], name: &str| -> Vec<(String, String)> {
        let d = objs.iter().find(|d| d.kind == Kind::Deployment && d.name == name).unwrap();
        d.object["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "GLIBC_TUNABLES")
            .map(|e| (e["name"].as_str().unwrap().into(), e["value"].as_str().unwrap().into()))
            .collect()
    };
    let ours = vec![("GLIBC_TUNABLES".to_string(), GPU_MALLOC_TUNABLES.to_string())];
    let gpu = desired(
        &isvc(
            json!({ "prefill": { "accelerator": "nvidia" }, "decode": { "accelerator": "nvidia" } }),
        ),
        &[],
    );
    assert_eq!(env_of(&gpu, "chat-decode"), ours);
    assert_eq!(env_of(&gpu, "chat-prefill"), ours);
    assert!(env_of(&gpu, "chat-router").is_empty(), "the router has no GPU");
    let cpu = desired(&isvc(json!({ "prefill": {}, "decode": {} })), &[]);
    assert!(env_of(&cpu, "chat-decode").is_empty() && env_of(&cpu, "chat-prefill").is_empty());
    let own = desired(
        &isvc(json!({ "decode": { "accelerator": "nvidia", "pod": { "env": [
            { "name": "GLIBC_TUNABLES", "value": "glibc.malloc.tcache_count=64" } ] } } })),
        &[],
    );
    let want = vec![("GLIBC_TUNABLES".to_string(), "glibc.malloc.tcache_count=64".to_string())];
    assert_eq!(env_of(&own, "chat-decode"), want, "the pod's own value, once");
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
