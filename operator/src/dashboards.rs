//! The Grafana dashboards the chart ships, and the chart files generated from Rust: the CRD,
//! the dashboards' JSON and the ConfigMaps that carry them to Grafana's sidecar.
//!
//! Every panel query uses the metric names the router and workers export (labels `model`,
//! `role`, `worker`), each series selector scoped by the dashboards' `model` and `namespace`
//! variables ([`scoped`]); the test suite runs each query against a real Prometheus scraping a
//! running deployment.

use serde_json::{json, Value};

/// One panel: title, unit, description and its queries (PromQL, legend).
struct Panel {
    title: &'static str,
    unit: &'static str,
    description: &'static str,
    queries: Vec<(String, &'static str)>,
}

fn p(
    title: &'static str,
    unit: &'static str,
    description: &'static str,
    queries: &[(&str, &'static str)],
) -> Panel {
    pq(title, unit, description, queries.iter().map(|(q, l)| (q.to_string(), *l)).collect())
}

fn quantiles(metric: &str, filter: &str, by: &str) -> Vec<(String, &'static str)> {
    let group = if by.is_empty() { "le".to_string() } else { format!("le, {by}") };
    let legend = |q: &'static str, l: &'static str| if by.is_empty() { q } else { l };
    vec![
        (
            format!(
                "histogram_quantile(0.5, sum by ({group}) (rate({metric}_bucket{filter}[2m])))"
            ),
            legend("p50", "p50 {{role}}"),
        ),
        (
            format!(
                "histogram_quantile(0.99, sum by ({group}) (rate({metric}_bucket{filter}[2m])))"
            ),
            legend("p99", "p99 {{role}}"),
        ),
    ]
}

fn pq(
    title: &'static str,
    unit: &'static str,
    description: &'static str,
    queries: Vec<(String, &'static str)>,
) -> Panel {
    Panel { title, unit, description, queries }
}

/// The dashboards: (file stem, uid, title, panels).
fn dashboards() -> Vec<(&'static str, &'static str, &'static str, Vec<Panel>)> {
    vec![
        (
            "overview",
            "tandem-overview",
            "Tandem / Overview",
            vec![
                p("Requests per second", "reqps", "HTTP generation requests at the routers, by endpoint and status code.", &[("sum by (endpoint, code) (rate(tandem_router_requests_total[2m]))", "{{endpoint}} {{code}}")]),
                p("Error ratio", "percentunit", "Share of generation requests answered with a non-200 status.", &[("sum(rate(tandem_router_requests_total{code!=\"200\"}[2m])) / sum(rate(tandem_router_requests_total[2m]))", "errors")]),
                pq("Time to first token", "s", "Request arrival at the router to the first token it sends.", quantiles("tandem_time_to_first_token_seconds", "{role=\"router\"}", "")),
                pq("Inter-token latency", "s", "Time between output tokens on the decode workers.", quantiles("tandem_inter_token_latency_seconds", "{role=~\"decode|both\"}", "")),
                pq("Hand-off to the engine thread", "s", "From a generate call's arrival at a decode worker until its engine thread took the prompt (new requests are taken between steps).", quantiles("tandem_worker_handoff_seconds", "{role=~\"decode|both\"}", "")),
                pq("End-to-end latency", "s", "Request arrival to last token, at the router.", quantiles("tandem_e2e_request_latency_seconds", "{role=\"router\"}", "")),
                p("Tokens per second", "short", "Generated tokens and computed prompt tokens per second, all workers.", &[("sum(rate(tandem_generation_tokens_total[2m]))", "generated"), ("sum by (role) (rate(tandem_prompt_tokens_total[2m]))", "prompt {{role}}")]),
                p("Queue depth by role", "short", "Sequences waiting for and running on the engines, by worker role.", &[("sum by (role) (tandem_num_requests_waiting)", "waiting {{role}}"), ("sum by (role) (tandem_num_requests_running)", "running {{role}}")]),
                p("Queued prefill tokens", "short", "Prompt tokens admitted but not yet computed, per worker.", &[("sum by (worker) (tandem_queued_prefill_tokens)", "{{worker}}")]),
                p("Engine busy", "percentunit", "Share of wall time each worker's engine thread spent in steps that ran the model. Under load, what is short of 1 went to work between steps (streaming outputs, admitting requests) or to waiting for requests.", &[("sum by (worker) (rate(tandem_engine_step_seconds_sum[2m]))", "{{worker}}")]),
                pq("Tokens per step", "short", "Tokens (prompt and generated) computed by each engine step, on the workers.", quantiles("tandem_iteration_tokens", "", "")),
                p("Engine step phases", "percentunit", "Share of wall time each worker's engine thread spent in each phase of its steps: schedule, forward (the model pass and sampling, including the wait for the device), update (appending tokens, detokenizing, stop checks) and outputs (building each request's news). On a GPU, the three host phases are time the device waits for the next pass.", &[("sum by (worker, phase) (rate(tandem_engine_phase_seconds_sum[2m]))", "{{worker}} {{phase}}")]),
            ],
        ),
        (
            "kv-cache",
            "tandem-kv-cache",
            "Tandem / KV cache",
            vec![
                p("KV cache usage", "percentunit", "Fraction of each worker's KV blocks in use.", &[("max by (worker) (tandem_kv_cache_usage_ratio)", "{{worker}}")]),
                p("Free KV blocks", "short", "Blocks free or evictable, and the pool size, per worker.", &[("sum by (worker) (tandem_kv_cache_free_blocks)", "free {{worker}}"), ("sum by (worker) (tandem_kv_cache_num_blocks)", "total {{worker}}")]),
                p("Prefix cache hit rate", "percentunit", "Prompt blocks found in the worker's prefix cache, of those looked up.", &[("sum by (worker) (rate(tandem_prefix_cache_hits_total[2m])) / sum by (worker) (rate(tandem_prefix_cache_queries_total[2m]))", "{{worker}}")]),
                p("Preemptions", "short", "Sequences preempted per second (KV cache pressure).", &[("sum by (worker) (rate(tandem_num_preemptions_total[2m]))", "{{worker}}")]),
                p("Swapped sequences", "short", "Sequences whose KV blocks sit in host memory.", &[("sum by (worker) (tandem_num_requests_swapped)", "{{worker}}")]),
            ],
        ),
        (
            "disaggregation",
            "tandem-disaggregation",
            "Tandem / Disaggregation",
            vec![
                p("KV transfer throughput", "Bps", "KV page bytes moved from prefill to decode workers.", &[("sum by (worker) (rate(tandem_kv_transfer_bytes_total[2m]))", "{{worker}}")]),
                pq("KV transfer latency", "s", "Duration of KV page transfers.", quantiles("tandem_kv_transfer_seconds", "", "")),
                p("KV transfer failures", "short", "Failed transfers per second, by reason (recompute hides them as latency: watch this).", &[("sum by (role, reason) (rate(tandem_kv_transfer_failures_total[5m]))", "{{role}} {{reason}}")]),
                p("Disaggregation decisions", "short", "Where decode workers had prompts prefilled: remote, or locally and why.", &[("sum by (decision) (rate(tandem_disagg_decisions_total[2m]))", "{{decision}}")]),
                pq("Prefill vs decode time", "s", "Median time a request spends on a prefill worker (its prefill) and on a decode worker (the whole generation).", vec![("histogram_quantile(0.5, sum by (le, role) (rate(tandem_e2e_request_latency_seconds_bucket{role=~\"prefill|decode\"}[2m])))".to_string(), "p50 {{role}}")]),
                p("Prefill queue", "short", "Prompt tokens waiting on each prefill worker.", &[("sum by (worker) (tandem_queued_prefill_tokens{role=\"prefill\"})", "{{worker}}")]),
            ],
        ),
        (
            "router",
            "tandem-router",
            "Tandem / Router",
            vec![
                p("Routing decisions by decode worker", "reqps", "Requests each decode worker received.", &[("sum by (decode_worker) (rate(tandem_router_decisions_total[2m]))", "{{decode_worker}}")]),
                p("Routing decisions by prefill worker", "reqps", "Requests each prefill worker was named for (none: decode prefills).", &[("sum by (prefill_worker) (rate(tandem_router_decisions_total[2m]))", "{{prefill_worker}}")]),
                p("Index used", "reqps", "Decisions made from the exact (KV events) or approximate index.", &[("sum by (mode) (rate(tandem_router_routed_total[2m]))", "{{mode}}")]),
                pq("Prefix match length", "short", "Prompt blocks the chosen worker already held.", quantiles("tandem_router_prefix_match_blocks", "", "")),
                p("Time to first token by phase", "s", "Mean per request at the routers: prepare (receipt to the generate call), worker_accept (until the worker's engine thread took the prompt), first_token_wait (until the first token arrived; the engine's own part is the workers' time to first token).", &[("sum by (phase) (rate(tandem_router_first_token_phase_seconds_sum[2m])) / sum by (phase) (rate(tandem_router_first_token_phase_seconds_count[2m]))", "{{phase}}")]),
                p("Booked load per worker", "short", "Queued prefill tokens and active decode blocks the routers booked on each worker.", &[("max by (target) (tandem_router_worker_queued_prefill_tokens)", "prefill tokens {{target}}"), ("max by (target) (tandem_router_worker_active_decode_blocks)", "decode blocks {{target}}")]),
                p("Index size", "short", "Blocks in each router's indexes.", &[("sum by (worker, index) (tandem_router_index_blocks)", "{{worker}} {{index}}")]),
                p("KV events", "short", "KV events read from Redis, by result (gaps trigger a resync).", &[("sum by (result) (rate(tandem_router_kv_events_total[2m]))", "{{result}}")]),
                p("Redis and exact index", "short", "1 while the router reads KV events from Redis / while its exact index is live.", &[("min by (worker) (tandem_router_redis_up)", "redis {{worker}}"), ("min by (worker) (tandem_router_exact_index_live)", "exact {{worker}}")]),
            ],
        ),
        (
            "speculative",
            "tandem-speculative",
            "Tandem / Speculative decoding",
            vec![
                p("Draft acceptance rate", "percentunit", "Accepted draft tokens of those proposed.", &[("sum by (worker) (rate(tandem_spec_decode_accepted_tokens_total[5m])) / sum by (worker) (rate(tandem_spec_decode_draft_tokens_total[5m]))", "{{worker}}")]),
                p("Draft tokens", "short", "Draft tokens proposed and accepted per second.", &[("sum(rate(tandem_spec_decode_draft_tokens_total[5m]))", "proposed"), ("sum(rate(tandem_spec_decode_accepted_tokens_total[5m]))", "accepted")]),
                p("Mean accepted length", "short", "Accepted draft tokens per verification step.", &[("sum(rate(tandem_spec_decode_accepted_tokens_total[5m])) / sum(rate(tandem_spec_decode_num_drafts_total[5m]))", "tokens")]),
                p("Acceptance by position", "short", "Accepted tokens per second at each draft position.", &[("sum by (position) (rate(tandem_spec_decode_accepted_tokens_per_pos_total[5m]))", "position {{position}}")]),
            ],
        ),
    ]
}

/// The label matchers of the dashboards' variables. A regex matcher matching the empty string
/// also matches series without the label: with "All" (`.*`) a Prometheus that adds no
/// `namespace` label (a static scrape) still shows everything.
const SCOPE: &str = "model=~\"$model\", namespace=~\"$namespace\"";

/// `expr` with every `tandem_…` series selector narrowed by [`SCOPE`] (no label of ours starts
/// with `tandem_`, so every such identifier is a metric name).
pub fn scoped(expr: &str) -> String {
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() + 64);
    let mut i = 0;
    while i < b.len() {
        let ident_start = (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            && expr[i..].starts_with("tandem_");
        if !ident_start {
            out.push(b[i] as char);
            i += 1;
            continue;
        }
        let end = i + expr[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(expr.len() - i);
        out.push_str(&expr[i..end]);
        match b.get(end) {
            Some(b'{') if b.get(end + 1) == Some(&b'}') => {
                out.push_str(&format!("{{{SCOPE}}}"));
                i = end + 2;
            }
            Some(b'{') => {
                out.push_str(&format!("{{{SCOPE}, "));
                i = end + 1;
            }
            _ => {
                out.push_str(&format!("{{{SCOPE}}}"));
                i = end;
            }
        }
    }
    out
}

/// The dashboards' variables: the data source, then namespace and model (multi-valued, "All"
/// by default), each offered from the series Prometheus has.
fn variables() -> Value {
    let ds = json!({ "type": "prometheus", "uid": "${datasource}" });
    let var = |name: &str, label: &str, query: &str| {
        json!({
            "name": name, "label": label, "type": "query", "datasource": ds,
            "query": { "query": query, "refId": name }, "definition": query,
            "includeAll": true, "allValue": ".*", "multi": true, "refresh": 2, "sort": 1,
            "current": { "text": "All", "value": "$__all" },
        })
    };
    json!([
        { "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus" },
        var("namespace", "Namespace", "label_values(tandem_num_requests_running, namespace)"),
        var("model", "Model", "label_values(tandem_num_requests_running{namespace=~\"$namespace\"}, model)"),
    ])
}

fn panel_json(id: usize, panel: &Panel) -> Value {
    let targets: Vec<Value> = panel
        .queries
        .iter()
        .enumerate()
        .map(|(i, (expr, legend))| json!({ "refId": ((b'A' + i as u8) as char).to_string(), "expr": scoped(expr), "legendFormat": legend, "datasource": { "type": "prometheus", "uid": "${datasource}" } }))
        .collect();
    json!({
        "id": id + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": { "type": "prometheus", "uid": "${datasource}" },
        "gridPos": { "h": 8, "w": 12, "x": (id % 2) * 12, "y": (id / 2) * 8 },
        "fieldConfig": { "defaults": { "unit": panel.unit }, "overrides": [] },
        "options": { "legend": { "displayMode": "list", "placement": "bottom" }, "tooltip": { "mode": "multi" } },
        "targets": targets,
    })
}

/// Every dashboard as (file stem, Grafana dashboard JSON).
pub fn all() -> Vec<(&'static str, Value)> {
    dashboards()
        .into_iter()
        .map(|(stem, uid, title, panels)| {
            let panels: Vec<Value> =
                panels.iter().enumerate().map(|(i, p)| panel_json(i, p)).collect();
            let d = json!({
                "uid": uid,
                "title": title,
                "tags": ["tandem"],
                "editable": true,
                "schemaVersion": 39,
                "version": 1,
                "refresh": "30s",
                "time": { "from": "now-1h", "to": "now" },
                "templating": { "list": variables() },
                "panels": panels,
            });
            (stem, d)
        })
        .collect()
}

/// Every PromQL query of every dashboard: (dashboard uid, panel title, query).
pub fn queries() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (_, d) in all() {
        for panel in d["panels"].as_array().expect("panels") {
            for t in panel["targets"].as_array().expect("targets") {
                out.push((
                    d["uid"].as_str().unwrap().to_string(),
                    panel["title"].as_str().unwrap().to_string(),
                    t["expr"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

/// The ConfigMap template carrying the dashboards to Grafana's sidecar. Go-template actions
/// are limited to `.Values`/`.Release` lookups and `if`, so any Go-template engine renders it;
/// Grafana's own `{{label}}` legends are escaped as `{{ "{{" }}`.
fn configmap_template(dashboards: &[(&'static str, Value)]) -> String {
    let mut t = String::from(
        "# Generated by `tandem-operator generate` from operator/src/dashboards.rs; do not edit.\n",
    );
    t.push_str("{{- if .Values.grafana.dashboards.enabled }}\n");
    for (i, (stem, d)) in dashboards.iter().enumerate() {
        if i > 0 {
            t.push_str("---\n");
        }
        let text = serde_json::to_string_pretty(&crate::crd::sorted(d.clone()))
            .expect("json")
            .replace("{{", "{{ \"{{\" }}");
        t.push_str(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}-dashboard-{stem}\n  namespace: {{{{ .Release.Namespace }}}}\n  labels:\n    app.kubernetes.io/name: tandem\n    app.kubernetes.io/instance: {{{{ .Release.Name }}}}\n    {{{{ .Values.grafana.dashboards.label }}}}: \"{{{{ .Values.grafana.dashboards.labelValue }}}}\"\n  annotations:\n    {{{{ .Values.grafana.dashboards.folderAnnotation }}}}: \"{{{{ .Values.grafana.dashboards.folder }}}}\"\ndata:\n  tandem-{stem}.json: |-\n"
        ));
        for line in text.lines() {
            t.push_str("    ");
            t.push_str(line);
            t.push('\n');
        }
    }
    t.push_str("{{- end }}\n");
    t
}

/// The chart's generated files, as (path under the chart, contents).
pub fn generated_files() -> Vec<(String, String)> {
    let ds = all();
    let mut out =
        vec![("crds/inferenceservices.tandem.dev.yaml".to_string(), crate::crd::crd_yaml())];
    for (stem, d) in &ds {
        out.push((
            format!("dashboards/{stem}.json"),
            serde_json::to_string_pretty(&crate::crd::sorted(d.clone())).expect("json") + "\n",
        ));
    }
    out.push(("templates/grafana-dashboards.yaml".to_string(), configmap_template(&ds)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_selector_is_scoped_by_model_and_namespace() {
        assert_eq!(
            scoped("sum(rate(tandem_a_total[2m])) / tandem_b{role=\"x\"} + tandem_c{}"),
            format!("sum(rate(tandem_a_total{{{SCOPE}}}[2m])) / tandem_b{{{SCOPE}, role=\"x\"}} + tandem_c{{{SCOPE}}}")
        );
        for (_, _, q) in queries() {
            let series = q.matches("tandem_").count();
            assert!(series > 0, "{q}");
            assert_eq!(q.matches(SCOPE).count(), series, "{q}");
        }
        for (_, d) in all() {
            let names: Vec<&str> = d["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["datasource", "namespace", "model"]);
        }
    }
}
