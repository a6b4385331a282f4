//! The router as the endpoint picker (EPP) of a Gateway API Inference Extension
//! `InferencePool`: the gateway (Envoy, or a proxy speaking Envoy's `ext_proc` protocol: Istio,
//! kgateway, agentgateway, NGINX Gateway Fabric) asks it, per request, which model server to
//! send the request to, and Tandem answers with the same choice its own front end would make:
//! the decode worker holding the longest cached prefix of the prompt, weighed against load
//! ([`crate::routing::Routing::route`]), and the prefill worker for it.
//!
//! One `Process` stream per HTTP request, in the order GIE's protocol gives (request and
//! response bodies in `FULL_DUPLEX_STREAMED` mode):
//! 1. Request headers are kept. A request without a body is picked at once, by load.
//! 2. Request body chunks are buffered (up to the router's body limit) until the last; the body
//!    is then read as the router reads it (same validation and tokenization: a bad request is
//!    answered here, with OpenAI's error JSON), the workers are chosen, and the picker sends a
//!    headers response setting `x-gateway-destination-endpoint` (and `x-prefiller-host-port`
//!    naming the prefill worker), clearing the route cache, with the endpoint also under
//!    `envoy.lb` in the dynamic metadata; then the body, unchanged, in chunks of at most
//!    62,000 bytes.
//! 3. Response headers, body chunks and trailers pass back unchanged. The load booked for the
//!    request is released when the response ends or the stream closes.
//!
//! A subset hint (`x-gateway-destination-endpoint-subset` under `envoy.lb.subset_hint` in the
//! request's metadata) limits the candidates. No eligible healthy decode worker: 503. Every
//! eligible worker with at least `shed_waiting` sequences waiting: 429 (the request is shed).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, external_processor_server::ExternalProcessor,
    external_processor_server::ExternalProcessorServer, processing_request::Request as In,
    processing_response::Response as Out, BodyMutation, BodyResponse, CommonResponse,
    HeaderMutation, HeadersResponse, ImmediateResponse, ProcessingRequest, ProcessingResponse,
    StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use metrics::counter;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::ApiError;
use crate::handlers::{on_tokenizer_pool, prepare_chat, prepare_completion};
use crate::routing::Route;
use crate::state::AppState;

/// The header (and `envoy.lb` metadata key) naming the chosen endpoint.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
pub use crate::relay::PREFILLER;
/// The dynamic-metadata namespace of the chosen endpoint.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The request-metadata namespace of a subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint's endpoint list.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Largest body chunk sent back (some proxies take at most 64 KiB per chunk).
const CHUNK: usize = 62_000;

/// How the picker sheds load.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickerConfig {
    /// Shed (429) when every eligible decode worker has at least this many sequences waiting.
    pub shed_waiting: Option<u32>,
}

/// The `ext_proc` service over the router's state.
pub struct Picker {
    st: Arc<AppState>,
    cfg: PickerConfig,
}

impl Picker {
    /// A picker choosing among `st`'s workers.
    pub fn new(st: Arc<AppState>, cfg: PickerConfig) -> Picker {
        Picker { st, cfg }
    }

    /// The gRPC service.
    pub fn server(self) -> ExternalProcessorServer<Picker> {
        ExternalProcessorServer::new(self)
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        req: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run(self.st.clone(), self.cfg, req.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One HTTP request's exchange.
async fn run(
    st: Arc<AppState>,
    cfg: PickerConfig,
    mut input: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
) {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut body: Vec<u8> = Vec::new();
    let mut subset: Option<Vec<String>> = None;
    // Held while the request runs: dropping it releases the booked load.
    // (Request trailers come before the response, so while they can, `route` says whether the
    // request has been picked.)
    let mut route: Option<Route> = None;
    while let Ok(Some(msg)) = input.message().await {
        if let Some(s) = subset_hint(&msg) {
            subset = Some(s);
        }
        let out = match msg.request {
            Some(In::RequestHeaders(h)) => {
                headers = h
                    .headers
                    .iter()
                    .flat_map(|m| m.headers.iter())
                    .map(|hv| (hv.key.to_ascii_lowercase(), header_text(hv)))
                    .collect();
                if !h.end_of_stream {
                    continue;
                }
                pick(&st, cfg, &headers, None, subset.as_deref()).await
            }
            Some(In::RequestBody(b)) => {
                if body.len() + b.body.len() > st.max_body_bytes {
                    let e = ApiError {
                        status: axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                        ..ApiError::invalid(
                            None,
                            format!(
                                "the request body is larger than this server's limit of {} bytes",
                                st.max_body_bytes
                            ),
                        )
                    };
                    Err(e)
                } else {
                    body.extend_from_slice(&b.body);
                    if !b.end_of_stream {
                        continue;
                    }
                    pick(&st, cfg, &headers, Some(&body), subset.as_deref()).await
                }
            }
            Some(In::RequestTrailers(_)) => {
                // Trailers can end a request whose last body chunk did not say so: pick now,
                // then answer the trailers (headers, body, trailers: the protocol's order).
                let trailers = reply(Out::RequestTrailers(TrailersResponse::default()));
                if route.is_some() {
                    Ok((vec![trailers], None))
                } else {
                    let b = (!body.is_empty()).then_some(body.as_slice());
                    pick(&st, cfg, &headers, b, subset.as_deref()).await.map(|(mut r, route)| {
                        r.push(trailers);
                        (r, route)
                    })
                }
            }
            Some(In::ResponseHeaders(_)) => {
                Ok((vec![reply(Out::ResponseHeaders(HeadersResponse::default()))], None))
            }
            Some(In::ResponseBody(b)) => {
                if b.end_of_stream {
                    route = None;
                }
                let chunk = streamed(b.body, b.end_of_stream);
                Ok((vec![reply(Out::ResponseBody(chunk))], None))
            }
            Some(In::ResponseTrailers(_)) => {
                route = None;
                Ok((vec![reply(Out::ResponseTrailers(TrailersResponse::default()))], None))
            }
            None => continue,
        };
        let replies = match out {
            Ok((replies, r)) => {
                if r.is_some() {
                    route = r;
                }
                replies
            }
            Err(e) => {
                let result = match e.status.as_u16() {
                    429 => "shed",
                    503 => "unavailable",
                    _ => "refused",
                };
                counter!("tandem_router_epp_picks_total", "result" => result).increment(1);
                tracing::info!(status = e.status.as_u16(), error = %e.message, "endpoint picker refused a request");
                let _ = tx.send(Ok(immediate(&e))).await;
                return;
            }
        };
        for r in replies {
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
        }
    }
    drop(route);
}

/// A header's value (Envoy sends `raw_value`; older ones `value`).
fn header_text(hv: &HeaderValue) -> String {
    if hv.raw_value.is_empty() {
        hv.value.clone()
    } else {
        String::from_utf8_lossy(&hv.raw_value).into_owned()
    }
}

/// The endpoints of a subset hint in the request's metadata.
fn subset_hint(msg: &ProcessingRequest) -> Option<Vec<String>> {
    let ns = msg.metadata_context.as_ref()?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let list = match ns.fields.get(SUBSET_KEY)?.kind.as_ref()? {
        Kind::ListValue(l) => l.values.clone(),
        _ => return Some(Vec::new()),
    };
    Some(
        list.into_iter()
            .filter_map(|v| match v.kind {
                Some(Kind::StringValue(s)) => Some(s),
                _ => None,
            })
            .collect(),
    )
}

/// Chooses the workers for a request: the replies to send (headers response, then the body
/// back in chunks) and the route whose load stays booked while the request runs.
async fn pick(
    st: &Arc<AppState>,
    cfg: PickerConfig,
    headers: &[(String, String)],
    body: Option<&[u8]>,
    subset: Option<&[String]>,
) -> Result<(Vec<ProcessingResponse>, Option<Route>), ApiError> {
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.split('?').next().unwrap_or("").to_string())
        .unwrap_or_default();
    // The prompt, read and checked as the router reads it; other requests go by load.
    let (id, prompt, salt) = match (body, path.as_str()) {
        (Some(b), "/v1/completions" | "/v1/chat/completions") => {
            let chat = path.ends_with("chat/completions");
            let b = b.to_vec();
            let p = on_tokenizer_pool(st, move |s| match chat {
                true => prepare_chat(s, &b),
                false => prepare_completion(s, &b),
            })
            .await?;
            (p.id, p.prompts.into_iter().next().unwrap_or_default(), p.cache_salt)
        }
        _ => (st.new_id("epp"), Vec::new(), String::new()),
    };
    let pool = st.pool.current();
    let eligible: Vec<_> = pool
        .decode
        .iter()
        .filter(|w| w.healthy() && subset.is_none_or(|s| s.contains(&w.addr)))
        .collect();
    if eligible.is_empty() {
        return Err(ApiError::unavailable(match subset {
            Some(_) => "no healthy model server among the gateway's subset hint",
            None => "no healthy model server",
        }));
    }
    if let Some(n) = cfg.shed_waiting {
        if eligible.iter().all(|w| w.waiting() >= n) {
            return Err(ApiError {
                status: axum::http::StatusCode::TOO_MANY_REQUESTS,
                ..ApiError::unavailable(format!(
                    "every model server has {n} or more requests waiting; retry later"
                ))
            });
        }
    }
    let exclude: Vec<String> = pool
        .decode
        .iter()
        .filter(|w| !eligible.iter().any(|e| e.addr == w.addr))
        .map(|w| w.addr.clone())
        .collect();
    let route = st
        .routing
        .route(&pool, &id, &prompt, &salt, &exclude, None)
        .ok_or_else(|| ApiError::unavailable("no healthy model server"))?;
    counter!("tandem_router_epp_picks_total", "result" => "picked").increment(1);
    let mut set = vec![header(DESTINATION, &route.decode.addr)];
    if let Some(p) = &route.prefill {
        set.push(header(PREFILLER, &p.addr));
    }
    let lb = Struct {
        fields: [(DESTINATION.to_string(), string(&route.decode.addr))].into_iter().collect(),
    };
    let mut first = reply(Out::RequestHeaders(HeadersResponse {
        response: Some(CommonResponse {
            header_mutation: Some(HeaderMutation { set_headers: set, ..Default::default() }),
            clear_route_cache: true,
            ..Default::default()
        }),
    }));
    first.dynamic_metadata = Some(Struct {
        fields: [(LB_NAMESPACE.to_string(), PbValue { kind: Some(Kind::StructValue(lb)) })]
            .into_iter()
            .collect(),
    });
    let mut replies = vec![first];
    if let Some(b) = body {
        let mut chunks: Vec<&[u8]> = b.chunks(CHUNK).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, c) in chunks.into_iter().enumerate() {
            replies.push(reply(Out::RequestBody(streamed(c.to_vec(), i == last))));
        }
    }
    Ok((replies, Some(route)))
}

fn reply(r: Out) -> ProcessingResponse {
    ProcessingResponse { response: Some(r), ..Default::default() }
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn string(s: &str) -> PbValue {
    PbValue { kind: Some(Kind::StringValue(s.to_string())) }
}

/// A body chunk passed back unchanged.
fn streamed(body: Vec<u8>, end_of_stream: bool) -> BodyResponse {
    BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    }
}

/// The gateway answers the client itself: `e`'s status and OpenAI's error JSON.
fn immediate(e: &ApiError) -> ProcessingResponse {
    let body = serde_json::json!({ "error": e.body() }).to_string().into_bytes();
    reply(Out::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(e.status.as_u16()) }),
        headers: Some(HeaderMutation {
            set_headers: vec![header("content-type", "application/json")],
            ..Default::default()
        }),
        body,
        ..Default::default()
    }))
}
