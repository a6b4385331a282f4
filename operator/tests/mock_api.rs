//! Controller scenarios against kube's mock service (tower-test): the client's requests are
//! answered by a small in-memory API server that keeps objects, applies server-side-apply,
//! merge and JSON patches, records every request, and lets a test inject failures and play the
//! part of the Deployment controller (rollout progress). Each scenario calls the reconciler the
//! way the controller runtime would and checks the requests it made and the status it wrote.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::Client;
use serde_json::{json, Value};
use tandem_operator::controller::{reconcile, Context, FINALIZER, MANAGER};
use tandem_operator::crd::InferenceService;

const NS: &str = "ml";
const ISVC: &str = "/apis/tandem.dev/v1alpha1/namespaces/ml/inferenceservices";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/ml/deployments";

/// One request as the fake saw it.
#[derive(Debug, Clone)]
struct Call {
    method: Method,
    path: String,
    query: String,
    content_type: String,
}

impl Call {
    fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

#[derive(Default)]
struct State {
    /// collection path → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    calls: Vec<Call>,
    /// (method, path suffix, status code): the next matching request fails with it.
    failures: Vec<(Method, String, u16)>,
    service_monitors: bool,
    rv: u64,
}

#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<State>>);

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message, "metadata": {} }),
    )
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn pointer_parent<'a>(obj: &'a mut Value, path: &str) -> (&'a mut Value, String) {
    let (parent, last) = path.rsplit_once('/').unwrap();
    (obj.pointer_mut(parent).unwrap(), last.to_string())
}

/// The JSON-patch operations the finalizer helper uses: test, add, remove.
fn json_patch(obj: &mut Value, ops: &Value) -> Result<(), String> {
    for op in ops.as_array().unwrap() {
        let path = op["path"].as_str().unwrap();
        match op["op"].as_str().unwrap() {
            "test" => {
                let have = obj.pointer(path).cloned().unwrap_or(Value::Null);
                if have != op["value"] {
                    return Err(format!("test failed at {path}: {have} != {}", op["value"]));
                }
            }
            "add" => {
                let (parent, last) = pointer_parent(obj, path);
                match parent {
                    Value::Array(a) if last == "-" => a.push(op["value"].clone()),
                    Value::Array(a) => a.insert(last.parse().unwrap(), op["value"].clone()),
                    Value::Object(o) => drop(o.insert(last, op["value"].clone())),
                    _ => return Err("bad add".into()),
                }
            }
            "remove" => {
                let (parent, last) = pointer_parent(obj, path);
                match parent {
                    Value::Array(a) => drop(a.remove(last.parse().unwrap())),
                    Value::Object(o) => drop(o.remove(&last)),
                    _ => return Err("bad remove".into()),
                }
            }
            other => return Err(format!("unsupported op {other}")),
        }
    }
    Ok(())
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap();
        obj["metadata"]["labels"][k] == v
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        kv.split_once('=')
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.replace("%2C", ",").replace("%3D", "=").replace("%2F", "/"))
    })
}

impl FakeApi {
    async fn serve(self, mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>) {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let (code, value) = self.handle(
                &parts.method,
                parts.uri.path(),
                parts.uri.query().unwrap_or(""),
                parts
                    .headers
                    .get("content-type")
                    .map(|h| h.to_str().unwrap().to_string())
                    .unwrap_or_default(),
                &bytes,
            );
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&value).unwrap()))
                    .unwrap(),
            );
        }
    }

    fn handle(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        content_type: String,
        body: &[u8],
    ) -> (u16, Value) {
        let mut st = self.0.lock().unwrap();
        st.calls.push(Call {
            method: method.clone(),
            path: path.into(),
            query: query.into(),
            content_type: content_type.clone(),
        });
        if let Some(i) =
            st.failures.iter().position(|(m, p, _)| m == method && path.ends_with(p.as_str()))
        {
            let (_, _, code) = st.failures.remove(i);
            return status(code, "Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again");
        }
        // /api(s)/.../namespaces/<ns>/<plural>[/<name>[/<sub>]]
        let (head, rest) = path.split_once(&format!("/namespaces/{NS}/")).expect("namespaced path");
        let mut segs = rest.split('/');
        let plural = segs.next().unwrap();
        let coll = format!("{head}/namespaces/{NS}/{plural}");
        let name = segs.next().map(str::to_string);
        let sub = segs.next();
        // The optional APIs (Prometheus Operator, Gateway API, Inference Extension) exist
        // together or not at all in these scenarios.
        let optional = ["servicemonitors", "inferencepools", "httproutes"];
        if optional.contains(&plural) && !st.service_monitors {
            return status(404, "NotFound", "the server could not find the requested resource");
        }
        st.rv += 1;
        let rv = st.rv.to_string();
        let store = st.objects.entry(coll.clone()).or_default();
        match (method.clone(), name) {
            (Method::GET, None) => {
                let sel = query_param(query, "labelSelector").unwrap_or_default();
                let items: Vec<Value> =
                    store.values().filter(|o| labels_match(o, &sel)).cloned().collect();
                (
                    200,
                    json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": rv }, "items": items }),
                )
            }
            (Method::GET, Some(n)) => match store.get(&n) {
                Some(o) => (200, o.clone()),
                None => status(404, "NotFound", &format!("{plural} {n} not found")),
            },
            (Method::POST, None) => {
                let mut o: Value = serde_json::from_slice(body).unwrap();
                let n = o["metadata"]["name"].as_str().map(str::to_string).unwrap_or_else(|| {
                    format!("{}-{rv}", o["metadata"]["generateName"].as_str().unwrap_or("obj"))
                });
                o["metadata"]["name"] = json!(n);
                o["metadata"]["resourceVersion"] = json!(rv);
                store.insert(n, o.clone());
                (201, o)
            }
            (Method::DELETE, Some(n)) => match store.remove(&n) {
                Some(_) => (
                    200,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {} }),
                ),
                None => status(404, "NotFound", &format!("{plural} {n} not found")),
            },
            (Method::PATCH, Some(n)) => {
                let patch: Value = serde_json::from_slice(body).unwrap();
                if content_type.starts_with("application/apply-patch") {
                    let mut o = store.get(&n).cloned().unwrap_or_else(
                        || json!({ "metadata": { "uid": format!("uid-{n}"), "generation": 0 } }),
                    );
                    let spec_changed = o.get("spec") != patch.get("spec");
                    let keep_status = o.get("status").cloned();
                    let keep_meta = o["metadata"].clone();
                    o = patch.clone();
                    o["metadata"]["uid"] = keep_meta["uid"].clone();
                    o["metadata"]["generation"] = json!(
                        keep_meta["generation"].as_i64().unwrap_or(0) + i64::from(spec_changed)
                    );
                    o["metadata"]["managedFields"] = json!([{ "manager": query_param(query, "fieldManager"), "operation": "Apply" }]);
                    if let Some(s) = keep_status {
                        o["status"] = s;
                    }
                    o["metadata"]["resourceVersion"] = json!(rv);
                    store.insert(n, o.clone());
                    return (200, o);
                }
                let Some(o) = store.get_mut(&n) else {
                    return status(404, "NotFound", "not found");
                };
                if content_type.starts_with("application/json-patch") {
                    if let Err(e) = json_patch(o, &patch) {
                        return status(422, "Invalid", &e);
                    }
                } else if sub == Some("status") {
                    merge_patch(&mut o["status"], &patch["status"]);
                } else {
                    merge_patch(o, &patch);
                }
                o["metadata"]["resourceVersion"] = json!(rv);
                let o = o.clone();
                // Deleted once its last finalizer is gone, as the API server does.
                if o["metadata"]["deletionTimestamp"].is_string()
                    && o["metadata"]["finalizers"].as_array().is_none_or(|f| f.is_empty())
                {
                    store.remove(&n);
                }
                (200, o)
            }
            (m, n) => panic!("unexpected {m} {path} {n:?}"),
        }
    }

    fn put(&self, coll: &str, obj: Value) {
        let mut st = self.0.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        st.objects.entry(coll.into()).or_default().insert(name, obj);
    }

    fn get(&self, coll: &str, name: &str) -> Option<Value> {
        self.0.lock().unwrap().objects.get(coll).and_then(|c| c.get(name)).cloned()
    }

    fn edit(&self, coll: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let mut st = self.0.lock().unwrap();
        f(st.objects.get_mut(coll).unwrap().get_mut(name).unwrap());
    }

    fn isvc(&self) -> Arc<InferenceService> {
        Arc::new(
            serde_json::from_value(self.get(ISVC, "chat").expect("the InferenceService exists"))
                .unwrap(),
        )
    }

    /// Changes the spec as `kubectl apply` would: new generation.
    fn update_spec(&self, f: impl FnOnce(&mut Value)) {
        self.edit(ISVC, "chat", |o| {
            f(&mut o["spec"]);
            let g = o["metadata"]["generation"].as_i64().unwrap();
            o["metadata"]["generation"] = json!(g + 1);
        });
    }

    /// Plays the Deployment controller: observes the latest generation, with `updated` of the
    /// desired replicas on the new template, `old` left on the previous one, `ready` ready.
    fn rollout(&self, name: &str, updated: Option<i64>, old: i64, ready: Option<i64>) {
        self.edit(DEPLOYMENTS, name, |d| {
            let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
            let updated = updated.unwrap_or(want);
            let ready = ready.unwrap_or(updated + old);
            d["status"] = json!({ "observedGeneration": d["metadata"]["generation"], "replicas": updated + old, "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready });
        });
    }

    fn roll_all(&self) {
        for role in ["router", "prefill", "decode"] {
            if self.get(DEPLOYMENTS, &format!("chat-{role}")).is_some() {
                self.rollout(&format!("chat-{role}"), None, 0, None);
            }
        }
    }

    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.0.lock().unwrap().calls)
    }

    fn fail_next(&self, method: Method, suffix: &str, code: u16) {
        self.0.lock().unwrap().failures.push((method, suffix.into(), code));
    }
}

fn setup(service_monitors: bool) -> (FakeApi, Arc<Context>) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let fake = FakeApi::default();
    fake.0.lock().unwrap().service_monitors = service_monitors;
    tokio::spawn(fake.clone().serve(handle));
    let client = Client::new(svc, NS);
    let mut ctx = Context::new(client, Some("test".into()));
    ctx.conflict_backoff = Duration::from_millis(1);
    ctx.now = || Time(k8s_openapi::jiff::Timestamp::from_second(1_790_000_000).unwrap());
    fake.put(
        ISVC,
        json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "InferenceService",
            "metadata": { "name": "chat", "namespace": NS, "uid": "isvc-uid", "generation": 1, "resourceVersion": "1" },
            "spec": { "prefill": { "replicas": 1 }, "decode": { "replicas": 2 } },
        }),
    );
    (fake, Arc::new(ctx))
}

fn condition(fake: &FakeApi, type_: &str) -> (String, String) {
    let o = fake.get(ISVC, "chat").unwrap();
    let c = o["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
        .clone();
    (c["status"].as_str().unwrap().into(), c["reason"].as_str().unwrap().into())
}

fn writes(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.is_write())
        .map(|c| format!("{} {}", c.method, c.path.rsplit("/namespaces/ml/").next().unwrap()))
        .collect()
}

fn events(fake: &FakeApi) -> Vec<Value> {
    fake.0
        .lock()
        .unwrap()
        .objects
        .get("/apis/events.k8s.io/v1/namespaces/ml/events")
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default()
}

async fn run(fake: &FakeApi, ctx: &Arc<Context>) -> Action {
    reconcile(fake.isvc(), ctx.clone()).await.unwrap_or_else(|e| panic!("reconcile failed: {e}"))
}

/// Create → finalizer, then every object by server-side apply, status Progressing; rollout →
/// Ready with a Normal event; re-apply of the unchanged spec writes nothing.
#[tokio::test]
async fn create_rollout_and_unchanged_reapply() {
    let (fake, ctx) = setup(false);
    assert_eq!(run(&fake, &ctx).await, Action::await_change());
    let calls = fake.take_calls();
    assert_eq!(writes(&calls), ["PATCH inferenceservices/chat"]);
    assert!(calls[0].content_type.starts_with("application/json-patch"));
    assert_eq!(fake.get(ISVC, "chat").unwrap()["metadata"]["finalizers"], json!([FINALIZER]));

    run(&fake, &ctx).await;
    let calls = fake.take_calls();
    let w = writes(&calls);
    assert_eq!(
        w,
        [
            "PATCH configmaps/chat-config",
            "PATCH services/chat",
            "PATCH services/chat-prefill",
            "PATCH services/chat-decode",
            "PATCH deployments/chat-router",
            "PATCH deployments/chat-prefill",
            "PATCH deployments/chat-decode",
            "PATCH poddisruptionbudgets/chat-router",
            "PATCH poddisruptionbudgets/chat-prefill",
            "PATCH poddisruptionbudgets/chat-decode",
            "PATCH inferenceservices/chat/status",
        ],
        "no ServiceMonitor where the API is missing"
    );
    for c in calls.iter().filter(|c| c.is_write() && !c.path.ends_with("/status")) {
        assert!(c.content_type.starts_with("application/apply-patch"), "{c:?}");
        assert!(
            c.query.contains(&format!("fieldManager={MANAGER}")) && c.query.contains("force=true"),
            "{c:?}"
        );
    }
    let d = fake.get(DEPLOYMENTS, "chat-decode").unwrap();
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "isvc-uid");
    assert_eq!(d["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(condition(&fake, "Ready"), ("False".into(), "RolloutInProgress".into()));
    assert_eq!(condition(&fake, "Progressing").0, "True");
    let st = fake.get(ISVC, "chat").unwrap()["status"].clone();
    assert_eq!(st["observedGeneration"], 1);
    assert_eq!(st["endpoint"], "http://chat.ml.svc:8000/v1");

    // The Deployment controller finishes the rollout: Ready, one Normal event.
    fake.roll_all();
    let action = run(&fake, &ctx).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert_eq!(writes(&fake.take_calls()), ["PATCH inferenceservices/chat/status", "POST events"]);
    for (t, want) in [
        ("Ready", "True"),
        ("WorkloadsReady", "True"),
        ("RouterReady", "True"),
        ("Progressing", "False"),
        ("Degraded", "False"),
    ] {
        assert_eq!(condition(&fake, t).0, want, "{t}");
    }
    let st = fake.get(ISVC, "chat").unwrap()["status"].clone();
    assert_eq!(
        st["decode"],
        json!({ "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2, "selector": "tandem.dev/service=chat,app.kubernetes.io/component=decode" })
    );
    let ev = events(&fake);
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0]["type"].as_str(), ev[0]["reason"].as_str()), (Some("Normal"), Some("Ready")));

    // Unchanged spec, reconciled again (a resync, a restart of the operator): reads only.
    for _ in 0..3 {
        run(&fake, &ctx).await;
        let calls = fake.take_calls();
        assert!(writes(&calls).is_empty(), "{:?}", writes(&calls));
        assert!(calls.iter().all(|c| c.method == Method::GET));
    }
}

async fn ready_service(service_monitors: bool) -> (FakeApi, Arc<Context>) {
    let (fake, ctx) = setup(service_monitors);
    run(&fake, &ctx).await;
    run(&fake, &ctx).await;
    fake.roll_all();
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "True");
    fake.take_calls();
    (fake, ctx)
}

/// A spec change rolls the pods: the status is not Ready while old pods serve or new ones are
/// not all ready, and Ready again once the rollout completes.
#[tokio::test]
async fn spec_update_is_not_ready_until_the_new_replicas_are() {
    let (fake, ctx) = ready_service(false).await;
    fake.update_spec(|s| s["kvTransfer"] = json!({ "failurePolicy": "fail" }));
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    // The ConfigMap changed, so every pod template (config hash) changed; Services and PDBs did not.
    assert_eq!(
        w,
        [
            "PATCH configmaps/chat-config",
            "PATCH deployments/chat-router",
            "PATCH deployments/chat-prefill",
            "PATCH deployments/chat-decode",
            "PATCH inferenceservices/chat/status"
        ]
    );
    assert_eq!(
        fake.get("/api/v1/namespaces/ml/configmaps", "chat-config").unwrap()["data"]
            ["TANDEM_KV_FAILURE_POLICY"],
        "fail"
    );
    assert_eq!(condition(&fake, "Ready"), ("False".into(), "RolloutInProgress".into()));
    assert_eq!(fake.get(ISVC, "chat").unwrap()["status"]["observedGeneration"], 2);

    // Router and prefill done; decode has one new pod and still one old one (all ready: the old
    // pods must not make the rollout look finished).
    fake.rollout("chat-router", None, 0, None);
    fake.rollout("chat-prefill", None, 0, None);
    fake.rollout("chat-decode", Some(1), 1, Some(2));
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "False");
    assert_eq!(condition(&fake, "Progressing"), ("True".into(), "RolloutInProgress".into()));
    // All new, one not ready yet.
    fake.rollout("chat-decode", None, 0, Some(1));
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "False");
    fake.rollout("chat-decode", None, 0, None);
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "True");
}

/// Scaling decode (what the CRD's scale subresource changes) patches only the decode
/// Deployment; an unschedulable new pod shows up as Degraded with the scheduler's message.
#[tokio::test]
async fn scale_and_unschedulable_pods() {
    let (fake, ctx) = ready_service(true).await;
    assert!(
        fake.get("/apis/monitoring.coreos.com/v1/namespaces/ml/servicemonitors", "chat").is_some(),
        "ServiceMonitor where the API exists"
    );
    fake.update_spec(|s| s["decode"]["replicas"] = json!(4));
    run(&fake, &ctx).await;
    assert_eq!(
        writes(&fake.take_calls()),
        ["PATCH deployments/chat-decode", "PATCH inferenceservices/chat/status"]
    );
    assert_eq!(fake.get(DEPLOYMENTS, "chat-decode").unwrap()["spec"]["replicas"], 4);
    let st = fake.get(ISVC, "chat").unwrap()["status"].clone();
    assert_eq!(st["decode"]["replicas"], 4);
    assert_eq!(condition(&fake, "Ready").0, "False");

    // Two new pods run; the other two cannot be placed.
    fake.rollout("chat-decode", Some(2), 0, Some(2));
    fake.put(
        "/api/v1/namespaces/ml/pods",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "chat-decode-x1", "namespace": NS, "labels": { "tandem.dev/service": "chat", "app.kubernetes.io/component": "decode" } },
            "status": { "phase": "Pending", "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu." }] },
        }),
    );
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Degraded"), ("True".into(), "Unschedulable".into()));
    assert_eq!(condition(&fake, "Ready"), ("False".into(), "Unschedulable".into()));
    let ev = events(&fake);
    assert!(
        ev.iter().any(|e| e["type"] == "Warning"
            && e["reason"] == "Unschedulable"
            && e["note"].as_str().unwrap().contains("Insufficient cpu")),
        "{ev:?}"
    );

    // Capacity arrives; the last pods start.
    fake.0.lock().unwrap().objects.remove("/api/v1/namespaces/ml/pods");
    fake.rollout("chat-decode", None, 0, None);
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "True");
    assert_eq!(condition(&fake, "Degraded").0, "False");
}

/// An invalid spec is reported (Degraded, Warning event) and changes no workload; reconciling
/// it again writes nothing more.
#[tokio::test]
async fn invalid_spec_is_degraded_with_an_event() {
    let (fake, ctx) = ready_service(false).await;
    let before = fake.get(DEPLOYMENTS, "chat-decode").unwrap();
    fake.update_spec(|s| {
        s["prefill"] = json!({ "tensorParallel": 2, "accelerator": "nvidia" });
        s["decode"]["accelerator"] = json!("nvidia");
    });
    assert_eq!(run(&fake, &ctx).await, Action::await_change());
    assert_eq!(writes(&fake.take_calls()), ["PATCH inferenceservices/chat/status", "POST events"]);
    assert_eq!(condition(&fake, "Degraded"), ("True".into(), "InvalidSpec".into()));
    assert_eq!(condition(&fake, "Ready"), ("False".into(), "InvalidSpec".into()));
    let o = fake.get(ISVC, "chat").unwrap();
    let msg = o["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(
            "spec.decode.tensorParallel (1) must be at least spec.prefill.tensorParallel (2)"
        ),
        "{msg}"
    );
    let ev = events(&fake);
    assert!(ev.iter().any(|e| e["type"] == "Warning" && e["reason"] == "InvalidSpec"), "{ev:?}");
    assert_eq!(fake.get(DEPLOYMENTS, "chat-decode").unwrap(), before, "workloads untouched");

    run(&fake, &ctx).await;
    assert!(writes(&fake.take_calls()).is_empty());

    // Fixed: applied and back to Ready after the rollout.
    fake.update_spec(|s| s["prefill"]["tensorParallel"] = json!(1));
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Degraded").0, "False");
    fake.roll_all();
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Ready").0, "True");
}

/// Deletion: the finalizer runs the cleanup (router first, then workers), then is removed and
/// the object goes away.
#[tokio::test]
async fn delete_with_finalizer() {
    let (fake, ctx) = ready_service(false).await;
    fake.edit(ISVC, "chat", |o| o["metadata"]["deletionTimestamp"] = json!("2026-11-22T12:00:00Z"));
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(
        w,
        [
            "DELETE deployments/chat-router",
            "DELETE deployments/chat-prefill",
            "DELETE deployments/chat-decode",
            "POST events",
            "PATCH inferenceservices/chat"
        ]
    );
    assert!(
        fake.get(DEPLOYMENTS, "chat-router").is_none()
            && fake.get(DEPLOYMENTS, "chat-decode").is_none()
    );
    assert!(fake.get(ISVC, "chat").is_none(), "the finalizer was removed and the object deleted");
}

/// A 409 Conflict on a write is retried within the reconcile.
#[tokio::test]
async fn api_conflicts_are_retried() {
    let (fake, ctx) = setup(false);
    run(&fake, &ctx).await;
    fake.take_calls();
    fake.fail_next(Method::PATCH, "deployments/chat-decode", 409);
    fake.fail_next(Method::PATCH, "inferenceservices/chat/status", 409);
    fake.fail_next(Method::PATCH, "inferenceservices/chat/status", 409);
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(w.iter().filter(|c| c.ends_with("deployments/chat-decode")).count(), 2, "{w:?}");
    assert_eq!(w.iter().filter(|c| c.ends_with("chat/status")).count(), 3, "{w:?}");
    assert!(fake.get(DEPLOYMENTS, "chat-decode").is_some());
    assert_eq!(condition(&fake, "Progressing").0, "True");
}

/// The Gateway API Inference Extension objects: an InferencePool where its API exists, an
/// HTTPRoute once `router.gateway` names a Gateway; each changed alone when its part of the
/// spec changes, the route deleted when the gateway is removed, the pool when it is switched
/// off; a gateway on a cluster without those APIs is reported, not ignored.
#[tokio::test]
async fn inference_pool_and_http_route_follow_the_spec() {
    const POOLS: &str = "/apis/inference.networking.k8s.io/v1/namespaces/ml/inferencepools";
    const ROUTES: &str = "/apis/gateway.networking.k8s.io/v1/namespaces/ml/httproutes";
    let (fake, ctx) = ready_service(true).await;
    let pool = fake.get(POOLS, "chat").expect("an InferencePool where the API exists");
    assert_eq!(pool["spec"]["endpointPickerRef"]["name"], "chat");
    assert_eq!(pool["spec"]["endpointPickerRef"]["failureMode"], "FailClose");
    assert_eq!(pool["spec"]["targetPorts"][0]["number"], 50061);
    assert!(fake.get(ROUTES, "chat").is_none(), "no route without a gateway");

    fake.update_spec(|s| s["router"]["gateway"] = json!({ "name": "inference-gw" }));
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(
        w.iter().filter(|c| !c.contains("inferenceservices")).collect::<Vec<_>>(),
        ["PATCH httproutes/chat"]
    );
    let route = fake.get(ROUTES, "chat").unwrap();
    assert_eq!(route["spec"]["parentRefs"][0]["name"], "inference-gw");
    assert_eq!(route["spec"]["rules"][0]["backendRefs"][0]["kind"], "InferencePool");
    assert_eq!(route["metadata"]["ownerReferences"][0]["uid"], "isvc-uid");

    fake.update_spec(|s| s["router"]["pickerFailureMode"] = json!("FailOpen"));
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(
        w.iter().filter(|c| !c.contains("inferenceservices")).collect::<Vec<_>>(),
        ["PATCH inferencepools/chat"]
    );
    assert_eq!(
        fake.get(POOLS, "chat").unwrap()["spec"]["endpointPickerRef"]["failureMode"],
        "FailOpen"
    );

    fake.update_spec(|s| {
        s["router"].as_object_mut().unwrap().remove("gateway").map(|_| ()).unwrap()
    });
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(
        w.iter().filter(|c| !c.contains("inferenceservices")).collect::<Vec<_>>(),
        ["DELETE httproutes/chat"]
    );
    assert!(fake.get(ROUTES, "chat").is_none() && fake.get(POOLS, "chat").is_some());

    fake.update_spec(|s| s["router"]["inferencePool"] = json!(false));
    run(&fake, &ctx).await;
    let w = writes(&fake.take_calls());
    assert_eq!(
        w.iter().filter(|c| !c.contains("inferenceservices")).collect::<Vec<_>>(),
        ["DELETE inferencepools/chat"]
    );
    assert!(fake.get(POOLS, "chat").is_none());

    // Without the APIs, a gateway cannot be honoured: Degraded, with the reason.
    let (fake, ctx) = ready_service(false).await;
    fake.update_spec(|s| s["router"]["gateway"] = json!({ "name": "inference-gw" }));
    run(&fake, &ctx).await;
    assert_eq!(condition(&fake, "Degraded"), ("True".into(), "GatewayApiMissing".into()));
}
