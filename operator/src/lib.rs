//! Kubernetes operator for Tandem: reconciles `InferenceService` resources (`tandem.dev/v1alpha1`)
//! into the router, prefill and decode workloads.
//!
//! - [`crd`]: the resource's types; the CRD YAML is generated from them.
//! - [`validate`]: the operator's check of a spec (mirrors the CRD's CEL rules).
//! - [`workloads`]: the objects a spec becomes (ConfigMap, Deployments, Services,
//!   PodDisruptionBudgets, ServiceMonitor).
//! - [`status`]: replica counts and conditions.
//! - [`controller`]: the reconciler (server-side apply, finalizer, Events).
//! - [`dashboards`]: the Grafana dashboards shipped in the chart.
//! - [`health`]: the operator's liveness and readiness probes.

pub mod controller;
pub mod crd;
pub mod dashboards;
pub mod health;
pub mod status;
pub mod validate;
pub mod workloads;
