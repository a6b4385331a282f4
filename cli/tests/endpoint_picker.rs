//! The router as a Gateway API Inference Extension endpoint picker, driven as Envoy drives an
//! `ext_proc` server (request headers, the body in chunks, then the upstream response's
//! headers and body through the picker), over real decode workers that serve the OpenAI API
//! themselves: the chosen endpoint holds the prompt's cached prefix; subset hints, a request
//! without a body, bad requests, no ready endpoint and shedding; gRPC health.

mod common;

use std::time::{Duration, Instant};

use common::*;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, external_processor_client::ExternalProcessorClient,
    processing_request::Request as In, processing_response::Response as Out, HttpBody, HttpHeaders,
    ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value as PbValue};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// What the picker decided for one request.
#[derive(Debug)]
enum Decision {
    /// The endpoint, its `envoy.lb` metadata value and the prefill worker header, if any.
    Picked { endpoint: String, metadata: String, prefill: Option<String> },
    /// An immediate response: status and body.
    Immediate(u16, Value),
}

fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

fn req(r: In, subset: Option<&[&str]>) -> ProcessingRequest {
    let metadata_context = subset.map(|s| {
        let list = ListValue {
            values: s
                .iter()
                .map(|e| PbValue { kind: Some(Kind::StringValue(e.to_string())) })
                .collect(),
        };
        let hint = Struct {
            fields: [(
                "x-gateway-destination-endpoint-subset".to_string(),
                PbValue { kind: Some(Kind::ListValue(list)) },
            )]
            .into_iter()
            .collect(),
        };
        Metadata {
            filter_metadata: [("envoy.lb.subset_hint".to_string(), hint)].into_iter().collect(),
            ..Default::default()
        }
    });
    ProcessingRequest { request: Some(r), metadata_context, ..Default::default() }
}

fn headers(method: &str, path: &str, len: usize, end_of_stream: bool) -> In {
    let h = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..Default::default()
    };
    In::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                h(":method", method),
                h(":path", path),
                h(":authority", "gateway"),
                h("content-type", "application/json"),
                h("content-length", &len.to_string()),
            ],
        }),
        end_of_stream,
        ..Default::default()
    })
}

/// One HTTP request through the picker as Envoy sends it; when an endpoint is picked, the
/// request is then sent there (as the proxy would) and its response passed back through the
/// picker, which must echo it unchanged. Returns the decision and the upstream response.
async fn through_picker(
    epp: &str,
    path: &str,
    body: Option<&Value>,
    subset: Option<&[&str]>,
) -> (Decision, Option<Value>) {
    let mut client = ExternalProcessorClient::connect(format!("http://{epp}")).await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    let mut replies = client.process(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let text = body.map(|b| b.to_string()).unwrap_or_default();
    let method = if body.is_some() { "POST" } else { "GET" };
    tx.send(req(headers(method, path, text.len(), body.is_none()), subset)).await.unwrap();
    if body.is_some() {
        // The body in two chunks, as a proxy streams it.
        let (a, b) = text.as_bytes().split_at(text.len() / 2);
        for (chunk, end) in [(a, false), (b, true)] {
            let body = HttpBody { body: chunk.to_vec(), end_of_stream: end, ..Default::default() };
            tx.send(req(In::RequestBody(body), None)).await.unwrap();
        }
    }
    let first: ProcessingResponse = replies.message().await.unwrap().expect("a reply");
    let decision = match first.response {
        Some(Out::ImmediateResponse(r)) => {
            let status = r.status.map(|s| s.code as u16).unwrap_or(0);
            return (Decision::Immediate(status, serde_json::from_slice(&r.body).unwrap()), None);
        }
        Some(Out::RequestHeaders(h)) => {
            let common = h.response.unwrap();
            assert!(common.clear_route_cache, "the route must be recomputed");
            let set = common.header_mutation.unwrap().set_headers;
            let get = |k: &str| {
                set.iter()
                    .filter_map(|o| o.header.as_ref())
                    .find(|h| h.key == k)
                    .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
            };
            let md = first.dynamic_metadata.expect("envoy.lb metadata");
            let lb = match &md.fields["envoy.lb"].kind {
                Some(Kind::StructValue(s)) => s.clone(),
                k => panic!("{k:?}"),
            };
            let metadata = match &lb.fields["x-gateway-destination-endpoint"].kind {
                Some(Kind::StringValue(s)) => s.clone(),
                k => panic!("{k:?}"),
            };
            Decision::Picked {
                endpoint: get("x-gateway-destination-endpoint").expect("destination header"),
                metadata,
                prefill: get("x-prefiller-host-port"),
            }
        }
        other => panic!("unexpected first reply {other:?}"),
    };
    // The body comes back unchanged, in chunks, the last marked.
    let mut echoed = Vec::new();
    if body.is_some() {
        loop {
            let r = replies.message().await.unwrap().expect("body reply");
            let Some(Out::RequestBody(b)) = r.response else { panic!("{r:?}") };
            let Some(Mutation::StreamedResponse(s)) =
                b.response.unwrap().body_mutation.unwrap().mutation
            else {
                panic!("streamed body expected")
            };
            echoed.extend(s.body);
            if s.end_of_stream {
                break;
            }
        }
        assert_eq!(echoed, text.as_bytes(), "the body passes unchanged");
    }
    // As the proxy: send the request to the endpoint with the headers the picker set, pass its
    // response through the picker.
    let Decision::Picked { endpoint, prefill, .. } = &decision else { unreachable!() };
    let extra =
        prefill.as_ref().map(|p| format!("x-prefiller-host-port: {p}\r\n")).unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let res = http_raw(endpoint, raw.as_bytes(), Duration::from_secs(120)).expect("HTTP request");
    let status_header = HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![HeaderValue {
                key: ":status".into(),
                raw_value: res.status.to_string().into_bytes(),
                ..Default::default()
            }],
        }),
        ..Default::default()
    };
    tx.send(req(In::ResponseHeaders(status_header), None)).await.unwrap();
    let r = replies.message().await.unwrap().expect("response headers reply");
    assert!(matches!(r.response, Some(Out::ResponseHeaders(_))), "{r:?}");
    let chunk =
        HttpBody { body: res.body.clone().into_bytes(), end_of_stream: true, ..Default::default() };
    tx.send(req(In::ResponseBody(chunk), None)).await.unwrap();
    let r = replies.message().await.unwrap().expect("response body reply");
    let Some(Out::ResponseBody(b)) = r.response else { panic!("{r:?}") };
    let Some(Mutation::StreamedResponse(s)) = b.response.unwrap().body_mutation.unwrap().mutation
    else {
        panic!("streamed body expected")
    };
    assert_eq!(s.body, res.body.as_bytes());
    assert!(s.end_of_stream);
    drop(tx);
    assert_eq!(res.status, 200, "{}", res.body);
    (decision, Some(res.json()))
}

/// A request whose body is ended by trailers (its last chunk does not say end of stream): the
/// picker answers after the trailers, in the protocol's order (headers, body, trailers).
async fn picks_after_trailers(epp: &str, path: &str, body: &Value) -> String {
    let mut client = ExternalProcessorClient::connect(format!("http://{epp}")).await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    let mut replies = client.process(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let text = body.to_string();
    tx.send(req(headers("POST", path, text.len(), false), None)).await.unwrap();
    let chunk = HttpBody { body: text.into_bytes(), end_of_stream: false, ..Default::default() };
    tx.send(req(In::RequestBody(chunk), None)).await.unwrap();
    tx.send(req(In::RequestTrailers(Default::default()), None)).await.unwrap();
    let first = replies.message().await.unwrap().expect("headers reply");
    let Some(Out::RequestHeaders(h)) = first.response else { panic!("{first:?}") };
    let set = h.response.unwrap().header_mutation.unwrap().set_headers;
    let endpoint = String::from_utf8(set[0].header.as_ref().unwrap().raw_value.clone()).unwrap();
    loop {
        let r = replies.message().await.unwrap().expect("a reply");
        match r.response {
            Some(Out::RequestBody(_)) => continue,
            Some(Out::RequestTrailers(_)) => break,
            other => panic!("{other:?}"),
        }
    }
    endpoint
}

fn picked(d: &Decision) -> &str {
    match d {
        Decision::Picked { endpoint, metadata, .. } => {
            assert_eq!(endpoint, metadata, "header and metadata must agree");
            endpoint
        }
        Decision::Immediate(s, b) => panic!("expected a pick, got {s} {b}"),
    }
}

fn hits(addr: &str) -> f64 {
    metric(addr, "tandem_prefix_cache_hits_total", &[]).unwrap_or(0.0)
}

#[test]
fn the_router_picks_endpoints_as_a_gateway_api_inference_extension_epp() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let worker = |extra: &[&str]| {
        let mut args = vec!["--colocated", "--serve-openai"];
        args.extend_from_slice(extra);
        decode(&args, &[])
    };
    let (d1, d2) = (worker(&["--max-num-seqs=1"]), worker(&[]));
    let epp = free_addr();
    let r = router_with(&[&d1, &d2], &[], &[&format!("--epp-listen={epp}")], &[]);
    rt.block_on(async {
        // gRPC health answers SERVING for the picker.
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{epp}")).unwrap().connect().await.unwrap();
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let status = health
            .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

        // Distinct long prompts land somewhere; each continuation goes where its prefix is
        // cached, and hits that worker's prefix cache.
        let mut placed = Vec::new();
        for i in 0..4 {
            let prompt = format!("Document {i}: {}", "the quick brown fox jumps over the lazy dog. ".repeat(12));
            let body = json!({ "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0 });
            let (d, res) = through_picker(&epp, "/v1/completions", Some(&body), None).await;
            assert_eq!(res.unwrap()["usage"]["completion_tokens"], 2);
            placed.push((prompt, picked(&d).to_string()));
        }
        for (prompt, home) in &placed {
            let before = hits(home);
            let body = json!({ "model": MODEL, "prompt": format!("{prompt} And then?"), "max_tokens": 2, "temperature": 0 });
            let (d, _) = through_picker(&epp, "/v1/completions", Some(&body), None).await;
            assert_eq!(picked(&d), home, "the continuation goes where its prefix is cached");
            assert!(hits(home) > before, "and hits the prefix cache there");
        }
        // Chat is read the same way.
        let chat = json!({ "model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2 });
        let (d, res) = through_picker(&epp, "/v1/chat/completions", Some(&chat), None).await;
        picked(&d);
        assert_eq!(res.unwrap()["object"], "chat.completion");

        // A subset hint limits the candidates: the prefix's home is left out, the other one
        // serves it; a hint naming no worker is a 503.
        let (prompt, home) = &placed[0];
        let other = if *home == d1.addr { d2.addr.clone() } else { d1.addr.clone() };
        let body = json!({ "model": MODEL, "prompt": format!("{prompt} More."), "max_tokens": 1 });
        let (d, _) = through_picker(&epp, "/v1/completions", Some(&body), Some(&[other.as_str()])).await;
        assert_eq!(picked(&d), other);
        let (d, _) = through_picker(&epp, "/v1/completions", Some(&body), Some(&["10.9.9.9:1"])).await;
        assert!(matches!(d, Decision::Immediate(503, _)), "{d:?}");

        // Trailers ending the body: picked then, answered in order.
        let chat_home = picks_after_trailers(&epp, "/v1/chat/completions", &chat).await;
        assert!([&d1.addr, &d2.addr].contains(&&chat_home), "{chat_home}");

        // A request without a body is picked by load.
        let (d, res) = through_picker(&epp, "/v1/models", None, None).await;
        picked(&d);
        assert_eq!(res.unwrap()["data"][0]["id"], MODEL);

        // A bad request is answered by the picker with OpenAI's error JSON.
        let bad = json!({ "model": MODEL, "prompt": "x", "max_tokens": -1 });
        let (d, _) = through_picker(&epp, "/v1/completions", Some(&bad), None).await;
        let Decision::Immediate(400, e) = d else { panic!("{d:?}") };
        assert_eq!(e["error"]["param"], "max_tokens", "{e}");
        let unknown = json!({ "model": "nope", "prompt": "x" });
        let (d, _) = through_picker(&epp, "/v1/completions", Some(&unknown), None).await;
        assert!(matches!(d, Decision::Immediate(404, _)), "{d:?}");
    });
    let picks =
        metric(&r.addr, "tandem_router_epp_picks_total", &["result=\"picked\""]).unwrap_or(0.0);
    assert!(picks >= 11.0, "{picks}");

    // Shedding: a picker over the one-sequence worker sheds while requests wait there.
    let epp2 = free_addr();
    let _r2 =
        router_with(&[&d1], &[], &[&format!("--epp-listen={epp2}"), "--epp-shed-waiting=1"], &[]);
    let busy = std::thread::spawn({
        let addr = d1.addr.clone();
        move || {
            let long = json!({ "model": MODEL, "prompt": "Count slowly:", "max_tokens": 120, "ignore_eos": true, "temperature": 0 }).to_string();
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let (a, b) = (addr.clone(), long.clone());
                    std::thread::spawn(move || http(&a, "POST", "/v1/completions", Some(&b)).status)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<u16>>()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&d1.addr, "tandem_num_requests_waiting", &[]).unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "requests never queued on the busy worker");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The router learns the queue at its next status check (every second).
    std::thread::sleep(Duration::from_millis(1500));
    let body = json!({ "model": MODEL, "prompt": "Hi", "max_tokens": 1 });
    let shed = rt.block_on(through_picker(&epp2, "/v1/completions", Some(&body), None)).0;
    let Decision::Immediate(429, e) = shed else { panic!("{shed:?}") };
    assert!(e["error"]["message"].as_str().unwrap().contains("waiting"), "{e}");
    assert_eq!(busy.join().unwrap(), [200, 200, 200]);
    std::thread::sleep(Duration::from_millis(1500));
    let (d, _) = rt.block_on(through_picker(&epp2, "/v1/completions", Some(&body), None));
    assert_eq!(picked(&d), d1.addr, "picked again once the queue drained");

    // No ready endpoint: 503.
    let epp3 = free_addr();
    let dead = free_addr();
    let args = [
        "router".to_string(),
        "--listen=127.0.0.1:0".into(),
        "--model".into(),
        model(),
        format!("--decode-workers={dead}"),
        format!("--epp-listen={epp3}"),
    ];
    let _r3 = Proc::start("router-dead", &args, &[]);
    let (d, _) = rt.block_on(through_picker(&epp3, "/v1/completions", Some(&body), None));
    assert!(matches!(d, Decision::Immediate(503, _)), "{d:?}");

    // The prefill worker the picker names (`x-prefiller-host-port`) is the one the decode
    // worker uses, among those it knows: this decode worker knows two, the picker's router one.
    let (p1, p2) = (prefill(&[], &[]), prefill(&[], &[]));
    let known = format!("--prefill-workers={},{}", p1.addr, p2.addr);
    let d3 = decode(&["--serve-openai", &known, "--disagg-min-tokens=1"], &[]);
    let epp4 = free_addr();
    let _r4 = router_with(&[&d3], &[&p2], &[&format!("--epp-listen={epp4}")], &[]);
    for i in 0..4 {
        let prompt =
            format!("Story {i}: {}", "once upon a time there was a prefill worker. ".repeat(6));
        let body = json!({ "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0 });
        let (d, _) = rt.block_on(through_picker(&epp4, "/v1/completions", Some(&body), None));
        let Decision::Picked { prefill, .. } = &d else { panic!("{d:?}") };
        assert_eq!(prefill.as_deref(), Some(p2.addr.as_str()));
    }
    let prompts = |p: &Proc| metric(&p.addr, "tandem_prompt_tokens_total", &[]).unwrap_or(0.0);
    assert!(prompts(&p2) > 0.0, "the named prefill worker computed the prompts");
    assert_eq!(prompts(&p1), 0.0, "the other one did not");
}
