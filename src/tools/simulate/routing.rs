//! A routing sidecar that follows llm-d's P/D protocol (its `nixlv2` connector), for trying
//! disaggregated serving on one machine and for the soak: for a request naming a prefill pod
//! in `x-prefiller-host-port`, it sends the prompt there as a one-token, non-streamed prefill
//! leg (`kv_transfer_params.do_remote_decode: true`), then sends the request to the decode
//! engine with the `kv_transfer_params` the prefill pod answered, streaming the answer back.
//! Every header of the client's request goes on both legs, with an `x-request-id` of its own
//! added. A request naming no prefill pod goes to the decode engine as it is. With an
//! allow-list it is llm-d's SSRF protection (`-enable-ssrf-protection=true`): a prefill pod
//! outside the list gets 403 and nothing is sent. It can speak TLS to prefill pods, their
//! certificates unverified (`--enable-tls=prefiller --tls-insecure-skip-verify=prefiller`).

use crate::serve::tls::ServerTls;
use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The largest request body it takes, and the largest prefill answer it reads.
const MAX_BODY_BYTES: usize = 64 << 20;

/// The header a router names the prefill pod in.
const PREFILLER: &str = "x-prefiller-host-port";

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

/// A routing sidecar in front of one decode engine.
#[derive(Debug)]
pub struct RoutingSidecar {
    decode: SocketAddr,
    allowed: Option<Vec<SocketAddr>>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// How prefill legs go: `http`, or `https` unverified.
    prefill_scheme: &'static str,
    next_id: AtomicU64,
}

impl RoutingSidecar {
    /// One in front of the decode engine at `decode`; with `allowed`, prefill legs go to those
    /// addresses alone.
    pub fn new(decode: SocketAddr, allowed: Option<Vec<SocketAddr>>) -> Arc<Self> {
        Self::with_prefill_scheme(decode, allowed, "http")
    }

    /// [`Self::new`], speaking TLS to prefill pods without verifying them.
    pub fn with_tls_to_prefill(decode: SocketAddr, allowed: Option<Vec<SocketAddr>>) -> Arc<Self> {
        Self::with_prefill_scheme(decode, allowed, "https")
    }

    fn with_prefill_scheme(decode: SocketAddr, allowed: Option<Vec<SocketAddr>>, scheme: &'static str) -> Arc<Self> {
        let unverified = crate::upstream::tls::UpstreamTls {
            insecure_skip_verify: true,
            ..Default::default()
        };
        let tls = crate::upstream::tls::client_config(&unverified, "prefill").expect("unverified TLS loads nothing");
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Arc::new(Self {
            decode,
            allowed,
            client: Client::builder(TokioExecutor::new()).build(connector),
            prefill_scheme: scheme,
            next_id: AtomicU64::new(1),
        })
    }

    /// Serves HTTP/1.1 and h2 on `listener` until `shutdown`, in TLS when `tls` is given (as
    /// llm-d's serves by default).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<Arc<ServerTls>>,
        shutdown: CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
            };
            let router = self.clone();
            let tls = tls.as_ref().map(|tls| tls.acceptor());
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let router = router.clone();
                    async move { Ok::<_, Infallible>(router.route(request).await) }
                });
                let server = auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    None => server.serve_connection(TokioIo::new(stream), service).await,
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(session) => server.serve_connection(TokioIo::new(session), service).await,
                        Err(_) => return,
                    },
                };
            });
        }
    }

    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let Ok(body) = Limited::new(body, MAX_BODY_BYTES).collect().await else {
            return status(StatusCode::BAD_REQUEST);
        };
        let body = body.to_bytes();
        let prefill = parts
            .headers
            .get(PREFILLER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let Some(prefill) = prefill else {
            return self
                .send("http", &self.decode.to_string(), &path, &parts.headers, body)
                .await;
        };
        let allowed = |pod: &str| {
            self.allowed
                .as_ref()
                .is_none_or(|allowed| allowed.iter().any(|a| a.to_string() == pod))
        };
        if !allowed(&prefill) {
            return status(StatusCode::FORBIDDEN);
        }
        let Ok(original) = serde_json::from_slice::<Value>(&body) else {
            return status(StatusCode::BAD_REQUEST);
        };
        let Some(mut leg) = original.as_object().cloned() else {
            return status(StatusCode::BAD_REQUEST);
        };
        let mut headers = parts.headers.clone();
        let id = format!("router-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        headers.append("x-request-id", id.parse().expect("a header value"));
        leg.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                "remote_block_ids": null, "remote_host": null, "remote_port": null,
            }),
        );
        leg.insert("stream".into(), json!(false));
        leg.remove("stream_options");
        leg.insert("max_tokens".into(), json!(1));
        let answer = self
            .send(
                self.prefill_scheme,
                &prefill,
                &path,
                &headers,
                Bytes::from(Value::Object(leg).to_string()),
            )
            .await;
        if !answer.status().is_success() {
            return status(answer.status());
        }
        let Ok(answered) = Limited::new(answer.into_body(), MAX_BODY_BYTES).collect().await else {
            return status(StatusCode::BAD_GATEWAY);
        };
        let params = serde_json::from_slice::<Value>(&answered.to_bytes())
            .ok()
            .and_then(|v| v.get("kv_transfer_params").cloned())
            .unwrap_or(Value::Null);
        let mut decode = original;
        decode["kv_transfer_params"] = params;
        self.send(
            "http",
            &self.decode.to_string(),
            &path,
            &headers,
            Bytes::from(decode.to_string()),
        )
        .await
    }

    /// POSTs `body` to `target` in `scheme` with the client's headers (less those the body and
    /// the target decide), the answer streamed back as it comes.
    async fn send(&self, scheme: &str, target: &str, path: &str, headers: &HeaderMap, body: Bytes) -> Response<Body> {
        let Ok(mut request) = Request::post(format!("{scheme}://{target}{path}")).body(Full::new(body)) else {
            return status(StatusCode::BAD_REQUEST);
        };
        for (name, value) in headers {
            if name != header::HOST && name != header::CONTENT_LENGTH {
                request.headers_mut().append(name, value.clone());
            }
        }
        match self.client.request(request).await {
            Ok(response) => response.map(|b| b.boxed_unsync()),
            Err(_) => status(StatusCode::BAD_GATEWAY),
        }
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = code;
    response
}
