//! The reconciler: makes the cluster match an `InferenceService`, reports what it sees, and
//! cleans up behind a finalizer.
//!
//! One reconcile lists each managed kind once (by the service's label), server-side applies
//! (field manager [`MANAGER`]) only the objects whose [`HASH_ANNOTATION`] differs from what it
//! would build, deletes objects the spec no longer has, and writes the status only when it
//! changed: re-applying an unchanged spec writes nothing. Conflicts (HTTP 409) are retried.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::crd::InferenceService;
use crate::status::{self, Problem};
use crate::validate;
use crate::workloads::{self, Desired, Kind, Role, HASH_ANNOTATION};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "tandem-operator";
/// The finalizer that lets the operator drain and delete in order.
pub const FINALIZER: &str = "tandem.dev/cleanup";

/// Reconcile failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object from the API did not parse as its type.
    #[error("parsing an object from the API: {0}")]
    Parse(String),
    /// The object has no namespace.
    #[error("InferenceService {0} has no namespace")]
    NoNamespace(String),
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Who publishes Events.
    pub reporter: Reporter,
    /// Pause before retrying a call that hit a conflict (doubled per attempt).
    pub conflict_backoff: Duration,
    /// The clock (tests pin it so statuses compare equal).
    pub now: fn() -> Time,
}

impl Context {
    /// A context for `client`, reporting Events as `tandem-operator` from `instance`.
    pub fn new(client: Client, instance: Option<String>) -> Context {
        Context {
            client,
            reporter: Reporter { controller: MANAGER.into(), instance },
            conflict_backoff: Duration::from_millis(200),
            now: || Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Runs `call` again (up to 5 times, with doubling pauses) while the API answers 409 Conflict.
async fn retry_conflicts<T, F, Fut>(ctx: &Context, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut pause = ctx.conflict_backoff;
    for attempt in 1.. {
        match call().await {
            Err(e) if is_status(&e, 409) && attempt < 5 => {
                tracing::info!(attempt, "conflict, retrying: {e}");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            r => return r,
        }
    }
    unreachable!()
}

/// Reconciles one `InferenceService`.
pub async fn reconcile(isvc: Arc<InferenceService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = isvc.namespace().ok_or_else(|| Error::NoNamespace(isvc.name_any()))?;
    let api: Api<InferenceService> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, isvc, |event| async {
        match event {
            FinalizerEvent::Apply(i) => apply(&i, &ctx, &ns).await,
            FinalizerEvent::Cleanup(i) => cleanup(&i, &ctx, &ns).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// What to do after a failed reconcile: retry soon.
pub fn error_policy(isvc: Arc<InferenceService>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(service = %status::describe(&isvc), "reconcile failed: {err}");
    Action::requeue(Duration::from_secs(15))
}

fn dyn_api(ctx: &Context, ns: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), ns, &kind.api_resource())
}

async fn publish(
    ctx: &Context,
    isvc: &InferenceService,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &isvc.object_ref(&())).await {
        tracing::warn!("publishing event {reason}: {e}");
    }
}

/// Writes `new` as the status unless it is already there.
async fn write_status(
    ctx: &Context,
    api: &Api<InferenceService>,
    isvc: &InferenceService,
    new: crate::crd::InferenceServiceStatus,
) -> Result<bool, Error> {
    if isvc.status.as_ref() == Some(&new) {
        return Ok(false);
    }
    let body = json!({ "status": new });
    let (name, pp, patch) = (isvc.name_any(), PatchParams::default(), Patch::Merge(&body));
    retry_conflicts(ctx, || api.patch_status(&name, &pp, &patch))
        .await
        .map_err(kube_err(format!("writing status of {}", status::describe(isvc))))?;
    Ok(true)
}

async fn apply(isvc: &InferenceService, ctx: &Context, ns: &str) -> Result<Action, Error> {
    let api: Api<InferenceService> = Api::namespaced(ctx.client.clone(), ns);
    let now = (ctx.now)();

    let problems = validate::problems(&isvc.spec);
    if !problems.is_empty() {
        let changed = write_status(ctx, &api, isvc, status::invalid(isvc, &problems, now)).await?;
        if changed {
            publish(ctx, isvc, EventType::Warning, "InvalidSpec", problems.join("; ")).await;
        }
        // Nothing to do until the spec changes; the workloads stay as they were.
        return Ok(Action::await_change());
    }

    // What exists: one list per kind. A missing optional API (ServiceMonitor, InferencePool,
    // HTTPRoute) answers 404.
    let selector = workloads::selector_string(isvc);
    let mut existing: BTreeMap<(Kind, String), DynamicObject> = BTreeMap::new();
    let mut apis = Vec::new();
    for kind in Kind::ALL {
        match dyn_api(ctx, ns, kind).list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                apis.push(kind);
                for o in list.items {
                    existing.insert((kind, o.name_any()), o);
                }
            }
            Err(e) if kind.optional() && is_status(&e, 404) => {}
            Err(e) => return Err(kube_err(format!("listing {:?}", kind))(e)),
        }
    }
    let mut problems = Vec::new();
    if isvc.spec.router.gateway.is_some()
        && !(apis.contains(&Kind::InferencePool) && apis.contains(&Kind::HttpRoute))
    {
        problems.push(Problem {
            reason: "GatewayApiMissing".into(),
            message: "spec.router.gateway needs the Gateway API (HTTPRoute) and the Inference Extension (InferencePool) installed in the cluster".into(),
        });
    }

    let desired = workloads::desired(isvc, &apis);
    let mut applied = Vec::new();
    let mut current: BTreeMap<(Kind, String), DynamicObject> = BTreeMap::new();
    for d in &desired {
        let key = (d.kind, d.name.clone());
        let have = existing.remove(&key);
        let same = have.as_ref().is_some_and(|o| {
            o.annotations().get(HASH_ANNOTATION).map(String::as_str) == Some(d.hash())
        });
        let obj = if same { have.expect("present") } else { server_side_apply(ctx, ns, d).await? };
        if !same {
            applied.push(format!("{:?}/{}", d.kind, d.name));
        }
        current.insert(key, obj);
    }
    // Objects of this service that the spec no longer has (prefill removed, monitor disabled).
    let owner = isvc.uid();
    for ((kind, name), o) in existing {
        let ours = o.owner_references().iter().any(|r| Some(&r.uid) == owner.as_ref());
        if ours {
            delete(ctx, ns, kind, &name).await?;
            applied.push(format!("deleted {kind:?}/{name}"));
        }
    }
    if !applied.is_empty() {
        tracing::info!(service = %status::describe(isvc), "applied: {}", applied.join(", "));
    }

    let mut deployments = BTreeMap::new();
    for role in Role::ALL {
        if let Some(o) = current.get(&(Kind::Deployment, workloads::role_name(isvc, role))) {
            let d: Deployment = o.clone().try_parse().map_err(|e| Error::Parse(e.to_string()))?;
            problems.extend(status::deployment_problems(role, &d));
            deployments.insert(role, d);
        }
    }
    let mut new = status::compute(isvc, &deployments, &problems, now.clone());
    if new.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False") {
        if let Some(p) = unschedulable(ctx, ns, isvc).await? {
            problems.push(p);
            new = status::compute(isvc, &deployments, &problems, now);
        }
    }
    let was_degraded = status::condition(isvc, "Degraded") == "True";
    let degraded = new
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .filter(|c| c.status == "True")
        .cloned();
    let ready = new.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
    let was_ready = status::condition(isvc, "Ready") == "True";
    if write_status(ctx, &api, isvc, new).await? {
        if let Some(c) = degraded.filter(|_| !was_degraded) {
            publish(ctx, isvc, EventType::Warning, &c.reason, c.message).await;
        } else if ready && !was_ready {
            publish(
                ctx,
                isvc,
                EventType::Normal,
                "Ready",
                format!("serving at {}", workloads::endpoint(isvc)),
            )
            .await;
        }
    }
    // Deployment changes wake the controller; the requeue only bounds how stale a status gets.
    Ok(Action::requeue(Duration::from_secs(if ready { 300 } else { 30 })))
}

async fn server_side_apply(ctx: &Context, ns: &str, d: &Desired) -> Result<DynamicObject, Error> {
    let api = dyn_api(ctx, ns, d.kind);
    let pp = PatchParams::apply(MANAGER).force();
    let patch = Patch::Apply(&d.object);
    retry_conflicts(ctx, || api.patch(&d.name, &pp, &patch))
        .await
        .map_err(kube_err(format!("applying {:?}/{}", d.kind, d.name)))
}

async fn delete(ctx: &Context, ns: &str, kind: Kind, name: &str) -> Result<(), Error> {
    let (api, dp) = (dyn_api(ctx, ns, kind), DeleteParams::foreground());
    match retry_conflicts(ctx, || api.delete(name, &dp)).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(kube_err(format!("deleting {kind:?}/{name}"))(e)),
    }
}

/// A pod of the service that the scheduler cannot place, as a problem.
async fn unschedulable(
    ctx: &Context,
    ns: &str,
    isvc: &InferenceService,
) -> Result<Option<Problem>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&workloads::selector_string(isvc)))
        .await
        .map_err(kube_err("listing pods"))?;
    for p in list.items {
        let conds = p.status.as_ref().and_then(|s| s.conditions.as_ref());
        if let Some(c) = conds.into_iter().flatten().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        }) {
            let role = p.labels().get(workloads::ROLE_LABEL).cloned().unwrap_or_default();
            return Ok(Some(Problem {
                reason: "Unschedulable".into(),
                message: format!(
                    "{role} pod {}: {}",
                    p.name_any(),
                    c.message.clone().unwrap_or_default()
                ),
            }));
        }
    }
    Ok(None)
}

/// Deletion: the router first (no new requests), then the workers, then the rest. Owner
/// references would remove them too, but in no particular order.
async fn cleanup(isvc: &InferenceService, ctx: &Context, ns: &str) -> Result<Action, Error> {
    for role in Role::ALL {
        delete(ctx, ns, Kind::Deployment, &workloads::role_name(isvc, role)).await?;
    }
    publish(ctx, isvc, EventType::Normal, "Deleted", "router and workers deleted".into()).await;
    Ok(Action::await_change())
}

/// Runs the controller until the process is told to stop.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    ready: Arc<crate::health::Readiness>,
) -> anyhow::Result<()> {
    let (isvcs, deployments) = match &namespace {
        Some(ns) => (
            Api::<InferenceService>::namespaced(client.clone(), ns),
            Api::<Deployment>::namespaced(client.clone(), ns),
        ),
        None => {
            (Api::<InferenceService>::all(client.clone()), Api::<Deployment>::all(client.clone()))
        }
    };
    if let Err(e) = isvcs.list(&ListParams::default().limit(1)).await {
        anyhow::bail!("the InferenceService API is not reachable (is the CRD installed?): {e}");
    }
    let ctx = Arc::new(Context::new(client, std::env::var("POD_NAME").ok()));
    ready.set(true);
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=tandem-operator");
    Controller::new(isvcs, watcher::Config::default())
        .owns(deployments, owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => tracing::debug!(service = %o.name, "reconciled"),
                Err(e) => tracing::debug!("reconcile error: {e}"),
            }
        })
        .await;
    Ok(())
}
