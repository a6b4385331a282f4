//! The Helm chart under `charts/tandem`: its generated files are current, every template renders
//! with a Go-template engine, and every rendered object parses as its Kubernetes type (strictly:
//! the typed object must serialize back to the same document, so a misspelt field fails).
//! Also the examples under `examples/`: each parses as an InferenceService the operator accepts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use tandem_operator::crd::InferenceService;
use tandem_operator::workloads::Kind;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn chart() -> PathBuf {
    repo().join("charts/tandem")
}

fn to_gtmpl(v: &Value) -> gtmpl_value::Value {
    use gtmpl_value::Value as G;
    match v {
        Value::Null => G::Nil,
        Value::Bool(b) => G::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                G::from(i)
            } else {
                G::from(n.as_f64().unwrap())
            }
        }
        Value::String(s) => G::String(s.clone()),
        Value::Array(a) => G::Array(a.iter().map(to_gtmpl).collect()),
        Value::Object(o) => {
            G::Object(o.iter().map(|(k, v)| (k.clone(), to_gtmpl(v))).collect::<HashMap<_, _>>())
        }
    }
}

fn yaml_to_json(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

/// Renders every template with `values` merged over values.yaml; returns the objects.
fn render(overrides: Value) -> Vec<Value> {
    let mut values = yaml_to_json(&std::fs::read_to_string(chart().join("values.yaml")).unwrap());
    merge(&mut values, overrides);
    let chart_meta = yaml_to_json(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap());
    let ctx = serde_json::json!({
        "Values": values,
        "Release": { "Name": "tandem", "Namespace": "tandem-system", "Service": "Helm" },
        "Chart": { "Name": chart_meta["name"], "Version": chart_meta["version"], "AppVersion": chart_meta["appVersion"] },
    });
    let mut objects = Vec::new();
    let mut files: Vec<_> =
        std::fs::read_dir(chart().join("templates")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let out = gtmpl::template(&text, to_gtmpl(&ctx))
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for doc in out.split("\n---\n") {
            let v: Value =
                serde_yaml::from_str(doc).unwrap_or_else(|e| panic!("{}: {e}\n{doc}", f.display()));
            if !v.is_null() {
                objects.push(v);
            }
        }
    }
    objects
}

fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o,
    }
}

/// Parses `v` as `T` and requires the typed object to serialize back to the same JSON.
fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> T {
    let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v:#}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(&back, v, "{} does not round-trip: a field is misspelt or misplaced", v["kind"]);
    typed
}

fn rules_cover_operator(rules: &[PolicyRule]) {
    let allows = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups.as_ref().is_some_and(|g| g.iter().any(|x| x == group))
                && r.resources.as_ref().is_some_and(|x| x.iter().any(|x| x == resource))
                && r.verbs.iter().any(|x| x == verb)
        })
    };
    for kind in Kind::ALL {
        let ar = kind.api_resource();
        for verb in ["list", "watch", "patch", "create", "delete"] {
            assert!(
                allows(&ar.group, &ar.plural, verb),
                "RBAC lacks {verb} on {}/{}",
                ar.group,
                ar.plural
            );
        }
    }
    for verb in ["get", "list", "watch", "patch"] {
        assert!(
            allows("tandem.dev", "inferenceservices", verb),
            "RBAC lacks {verb} on inferenceservices"
        );
    }
    assert!(allows("tandem.dev", "inferenceservices/status", "patch"));
    assert!(allows("", "pods", "list"));
    assert!(allows("events.k8s.io", "events", "create"));
    assert!(!allows("", "secrets", "get"), "the operator reads no secrets");
    assert!(
        !rules.iter().any(|r| r.verbs.iter().any(|v| v == "*")
            || r.resources.as_ref().is_some_and(|x| x.iter().any(|x| x == "*"))),
        "no wildcards"
    );
}

#[test]
fn generated_chart_files_are_current() {
    for (path, text) in tandem_operator::dashboards::generated_files() {
        let on_disk = std::fs::read_to_string(chart().join(&path)).unwrap_or_default();
        assert!(
            on_disk == text,
            "charts/tandem/{path} is stale: run `cargo run -p tandem-operator -- generate`"
        );
    }
}

#[test]
fn chart_renders_and_every_object_parses_as_its_type() {
    let objects = render(serde_json::json!({}));
    let mut kinds: Vec<String> =
        objects.iter().map(|o| o["kind"].as_str().unwrap().to_string()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "ServiceAccount"
        ]
    );
    let dashboards: HashMap<String, Value> = tandem_operator::dashboards::all()
        .into_iter()
        .map(|(s, d)| (format!("tandem-{s}.json"), d))
        .collect();
    for o in &objects {
        match o["kind"].as_str().unwrap() {
            "ServiceAccount" => drop(strict::<ServiceAccount>(o)),
            "ClusterRole" => rules_cover_operator(&strict::<ClusterRole>(o).rules.unwrap()),
            "ClusterRoleBinding" => {
                let b = strict::<ClusterRoleBinding>(o);
                assert_eq!(b.subjects.unwrap()[0].name, "tandem-operator");
            }
            "Deployment" => {
                let d = strict::<Deployment>(o);
                let pod = d.spec.template.spec.unwrap();
                assert_eq!(pod.service_account_name.as_deref(), Some("tandem-operator"));
                let c = &pod.containers[0];
                assert_eq!(c.image.as_deref(), Some("ghcr.io/tandem-serving/tandem:0.1.0"));
                assert_eq!(c.command.as_deref(), Some(&["tandem-operator".to_string()][..]));
                // Probes on the port the operator serves them on.
                let args = c.args.clone().unwrap();
                assert!(args.contains(&"--health-listen=0.0.0.0:8081".to_string()), "{args:?}");
                let port = &c.ports.as_ref().unwrap()[0];
                assert_eq!((port.name.as_deref(), port.container_port), (Some("health"), 8081));
                for (probe, path) in
                    [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")]
                {
                    let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
                    assert_eq!(get.path.as_deref(), Some(path));
                    assert_eq!(
                        get.port,
                        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                            "health".into()
                        )
                    );
                }
            }
            "ConfigMap" => {
                let cm = strict::<ConfigMap>(o);
                assert_eq!(cm.metadata.labels.unwrap()["grafana_dashboard"], "1");
                for (file, text) in cm.data.unwrap() {
                    let parsed: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(
                        &parsed, &dashboards[&file],
                        "{file} in the ConfigMap differs from the dashboard"
                    );
                }
            }
            k => panic!("unexpected kind {k}"),
        }
    }
    // Grafana's own legend templates survive the Go-template rendering.
    let overview =
        objects.iter().find(|o| o["metadata"]["name"] == "tandem-dashboard-overview").unwrap();
    assert!(overview["data"]["tandem-overview.json"]
        .as_str()
        .unwrap()
        .contains("{{endpoint}} {{code}}"));

    // Namespaced install, no dashboards: a Role and RoleBinding in the watched namespace.
    let objects = render(
        serde_json::json!({ "watchNamespace": "ml", "grafana": { "dashboards": { "enabled": false } } }),
    );
    let mut kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    kinds.sort();
    assert_eq!(kinds, ["Deployment", "Role", "RoleBinding", "ServiceAccount"]);
    for o in &objects {
        match o["kind"].as_str().unwrap() {
            "Role" => {
                let r = strict::<Role>(o);
                assert_eq!(r.metadata.namespace.as_deref(), Some("ml"));
                rules_cover_operator(&r.rules.unwrap());
            }
            "RoleBinding" => assert_eq!(strict::<RoleBinding>(o).role_ref.kind, "Role"),
            "Deployment" => {
                let d = strict::<Deployment>(o);
                let env = d.spec.template.spec.unwrap().containers[0].env.clone().unwrap();
                assert!(env.iter().any(
                    |e| e.name == "TANDEM_WATCH_NAMESPACE" && e.value.as_deref() == Some("ml")
                ));
            }
            _ => {}
        }
    }
}

#[test]
fn crd_parses_and_examples_are_accepted() {
    let text =
        std::fs::read_to_string(chart().join("crds/inferenceservices.tandem.dev.yaml")).unwrap();
    let crd: CustomResourceDefinition = strict(&yaml_to_json(&text));
    assert_eq!(crd.spec.group, "tandem.dev");
    let v = &crd.spec.versions[0];
    assert!(
        v.subresources.as_ref().unwrap().scale.is_some()
            && v.subresources.as_ref().unwrap().status.is_some()
    );

    let mut n = 0;
    for e in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("yaml") {
            continue;
        }
        let v = yaml_to_json(&std::fs::read_to_string(&path).unwrap());
        let isvc: InferenceService =
            serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(v["apiVersion"], "tandem.dev/v1alpha1");
        let problems = tandem_operator::validate::problems(&isvc.spec);
        assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        // The API server's CEL rules accept it too.
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"]
            ["properties"]["spec"]
            .clone();
        let cel = kube::core::cel::Validator::new().validate(&schema, &v["spec"], None);
        assert!(cel.is_ok(), "{}: {cel:?}", path.display());
        n += 1;
    }
    assert!(n >= 2, "examples for CPU and GPU");
}
