//! The status the operator reports: per-role replica counts and the conditions `Ready`,
//! `WorkloadsReady`, `RouterReady`, `Progressing` and `Degraded`.
//!
//! A role counts as rolled out only when its Deployment has observed its latest generation and
//! every replica runs the current template and is available, so old pods never make a rollout
//! look finished; `Ready` is never true while anything is `Progressing`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::crd::{InferenceService, InferenceServiceStatus, RoleStatus};
use crate::workloads::{endpoint, role_selector, Role};

/// What went wrong, for the `Degraded` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase reason.
    pub reason: String,
    /// What to tell the user.
    pub message: String,
}

/// A role's counts from its Deployment, and whether its rollout is complete.
pub fn role_status(
    isvc: &InferenceService,
    role: Role,
    d: Option<&Deployment>,
) -> (RoleStatus, bool) {
    let selector = role_selector(isvc, role);
    let Some(d) = d else {
        return (RoleStatus { selector, ..Default::default() }, false);
    };
    let st = d.status.clone().unwrap_or_default();
    let want = d.spec.replicas.unwrap_or(1);
    let observed =
        st.observed_generation.is_some() && st.observed_generation == d.metadata.generation;
    let updated = st.updated_replicas.unwrap_or(0);
    let available = st.available_replicas.unwrap_or(0);
    let total = st.replicas.unwrap_or(0);
    let done = observed && updated == want && total == want && available >= want;
    let rs = RoleStatus {
        replicas: want,
        updated_replicas: updated,
        ready_replicas: st.ready_replicas.unwrap_or(0),
        available_replicas: available,
        selector,
    };
    (rs, done)
}

/// Problems a Deployment reports itself: a rollout past its deadline, pods it cannot create.
pub fn deployment_problems(role: Role, d: &Deployment) -> Vec<Problem> {
    let mut out = Vec::new();
    for c in d.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten() {
        let msg = c.message.clone().unwrap_or_default();
        if c.type_.as_deref() == Some("Progressing")
            && c.status.as_deref() == Some("False")
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        {
            out.push(Problem {
                reason: "ProgressDeadlineExceeded".into(),
                message: format!("{}: {msg}", role.as_str()),
            });
        }
        if c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True") {
            out.push(Problem {
                reason: c.reason.clone().unwrap_or_else(|| "ReplicaFailure".into()),
                message: format!("{}: {msg}", role.as_str()),
            });
        }
    }
    out
}

/// Builds the status from the role Deployments (`None` where missing) and `problems`, keeping
/// each condition's transition time from `old` while its status is unchanged.
pub fn compute(
    isvc: &InferenceService,
    deployments: &BTreeMap<Role, Deployment>,
    problems: &[Problem],
    now: Time,
) -> InferenceServiceStatus {
    let old = isvc.status.clone().unwrap_or_default();
    let gen = isvc.metadata.generation;
    let (router, router_done) = role_status(isvc, Role::Router, deployments.get(&Role::Router));
    let (decode, decode_done) = role_status(isvc, Role::Decode, deployments.get(&Role::Decode));
    let prefill = isvc
        .spec
        .prefill
        .as_ref()
        .map(|_| role_status(isvc, Role::Prefill, deployments.get(&Role::Prefill)));
    let prefill_done = prefill.as_ref().is_none_or(|p| p.1);

    let mut rolling: Vec<&str> = Vec::new();
    for (role, done) in
        [(Role::Router, router_done), (Role::Prefill, prefill_done), (Role::Decode, decode_done)]
    {
        if !done {
            rolling.push(role.as_str());
        }
    }
    let workloads_ready = decode_done && prefill_done && decode.available_replicas > 0;
    let router_ready = router_done && router.available_replicas > 0;
    let progressing = !rolling.is_empty();
    let degraded = problems.first();
    let ready = workloads_ready && router_ready && !progressing && degraded.is_none();

    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" }.to_string();
        let since = old
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone());
        Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message,
            observed_generation: gen,
            last_transition_time: since.unwrap_or_else(|| now.clone()),
        }
    };
    let counts = |name: &str, r: &RoleStatus| {
        format!("{name} {}/{} ready, {} updated", r.ready_replicas, r.replicas, r.updated_replicas)
    };
    let mut summary = vec![counts("router", &router)];
    if let Some((p, _)) = &prefill {
        summary.push(counts("prefill", p));
    }
    summary.push(counts("decode", &decode));
    let summary = summary.join("; ");

    let conditions = vec![
        match (ready, degraded) {
            (true, _) => cond("Ready", true, "AllReady", format!("serving at {}", endpoint(isvc))),
            (false, Some(p)) => cond("Ready", false, &p.reason, p.message.clone()),
            (false, None) if progressing => cond(
                "Ready",
                false,
                "RolloutInProgress",
                format!("rolling out: {}", rolling.join(", ")),
            ),
            (false, None) => cond("Ready", false, "NotAvailable", summary.clone()),
        },
        if workloads_ready {
            cond("WorkloadsReady", true, "WorkersAvailable", summary.clone())
        } else {
            cond("WorkloadsReady", false, "WorkersNotReady", summary.clone())
        },
        if router_ready {
            cond("RouterReady", true, "RouterAvailable", counts("router", &router))
        } else {
            cond("RouterReady", false, "RouterNotReady", counts("router", &router))
        },
        if progressing {
            cond(
                "Progressing",
                true,
                "RolloutInProgress",
                format!("rolling out: {}", rolling.join(", ")),
            )
        } else {
            cond("Progressing", false, "RolloutComplete", "every role runs the current spec".into())
        },
        match degraded {
            Some(p) => cond(
                "Degraded",
                true,
                &p.reason,
                problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; "),
            ),
            None => cond("Degraded", false, "AsExpected", String::new()),
        },
    ];
    InferenceServiceStatus {
        observed_generation: gen,
        router,
        prefill: prefill.map(|p| p.0),
        decode,
        conditions,
        endpoint: Some(endpoint(isvc)),
    }
}

/// The status of a spec the operator refused: only `Degraded` (and `Ready` false) change; the
/// counts stay as last observed.
pub fn invalid(isvc: &InferenceService, problems: &[String], now: Time) -> InferenceServiceStatus {
    let mut st = isvc.status.clone().unwrap_or_default();
    let message = problems.join("; ");
    let gen = isvc.metadata.generation;
    let set = |conds: &mut Vec<Condition>, type_: &str, status: &str, reason: &str| {
        let keep = conds
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone());
        conds.retain(|c| c.type_ != type_);
        conds.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.clone(),
            observed_generation: gen,
            last_transition_time: keep.unwrap_or_else(|| now.clone()),
        });
    };
    set(&mut st.conditions, "Ready", "False", "InvalidSpec");
    set(&mut st.conditions, "Degraded", "True", "InvalidSpec");
    st.conditions.sort_by_key(|c| {
        ["Ready", "WorkloadsReady", "RouterReady", "Progressing", "Degraded"]
            .iter()
            .position(|t| *t == c.type_)
    });
    st.observed_generation = gen;
    st
}

/// The value of condition `type_` in `isvc`'s status ("True", "False" or "" when absent).
pub fn condition(isvc: &InferenceService, type_: &str) -> String {
    isvc.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// Name used in messages.
pub fn describe(isvc: &InferenceService) -> String {
    format!("{}/{}", isvc.namespace().unwrap_or_default(), isvc.name_any())
}
