//! A routing sidecar for tests that follows llm-d's P/D protocol (its `nixlv2` connector), as
//! its public source documents it; written for these tests. For a request naming a prefill
//! pod in `x-prefiller-host-port`, it sends the prompt there as a one-token, non-streamed
//! prefill leg (`kv_transfer_params.do_remote_decode: true`), then sends the request to the
//! local decode engine with the `kv_transfer_params` the prefill pod answered, streaming the
//! answer back. Every header of the client's request goes on both legs, with an
//! `x-request-id` of the routing sidecar's own added. A request naming no prefill pod goes
//! to the decode engine as it is. Started with an allow-list, it is llm-d's SSRF protection
//! (`-enable-ssrf-protection=true`): a prefill pod outside the list gets 403 and nothing is sent.

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

struct Router {
    decode: SocketAddr,
    /// The prefill addresses it may send legs to, when its SSRF protection is on.
    allowed: Option<Vec<String>>,
    client: Client<HttpConnector, Full<Bytes>>,
    next_id: AtomicU64,
}

/// Starts the routing sidecar on 127.0.0.1:0 in front of the decode engine at `decode`.
pub async fn start_routing_sidecar(decode: SocketAddr) -> SocketAddr {
    start_routing_sidecar_at("127.0.0.1:0".parse().unwrap(), decode).await
}

/// Starts the routing sidecar on `listen` in front of the decode engine at `decode`.
pub async fn start_routing_sidecar_at(listen: SocketAddr, decode: SocketAddr) -> SocketAddr {
    start(listen, decode, None).await
}

/// Starts the routing sidecar with its SSRF protection on: legs go to `allowed` alone.
pub async fn start_protected_routing_sidecar(decode: SocketAddr, allowed: &[SocketAddr]) -> SocketAddr {
    let allowed = allowed.iter().map(ToString::to_string).collect();
    start("127.0.0.1:0".parse().unwrap(), decode, Some(allowed)).await
}

async fn start(listen: SocketAddr, decode: SocketAddr, allowed: Option<Vec<String>>) -> SocketAddr {
    let listener = TcpListener::bind(listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Arc::new(Router {
        decode,
        allowed,
        client: Client::builder(TokioExecutor::new()).build_http(),
        next_id: AtomicU64::new(1),
    });
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let router = router.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let router = router.clone();
                    async move { Ok::<_, Infallible>(router.route(request).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

impl Router {
    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let prefill = parts
            .headers
            .get("x-prefiller-host-port")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let Some(prefill) = prefill else {
            return self.send(self.decode.to_string(), &path, &parts.headers, body).await;
        };
        if self.allowed.as_ref().is_some_and(|allowed| !allowed.contains(&prefill)) {
            return status(StatusCode::FORBIDDEN);
        }
        let Ok(mut completion) = serde_json::from_slice::<Value>(&body) else {
            return status(StatusCode::BAD_REQUEST);
        };
        let id = format!("router-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let mut headers = parts.headers.clone();
        headers.append("x-request-id", id.parse().unwrap());
        let original = completion.clone();
        completion["kv_transfer_params"] = json!({
            "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
            "remote_block_ids": null, "remote_host": null, "remote_port": null,
        });
        completion["stream"] = json!(false);
        completion.as_object_mut().unwrap().remove("stream_options");
        completion["max_tokens"] = json!(1);
        let answer = self
            .send(prefill, &path, &headers, Bytes::from(completion.to_string()))
            .await;
        if !answer.status().is_success() {
            return status(answer.status());
        }
        let answered = answer.into_body().collect().await.unwrap().to_bytes();
        let params = serde_json::from_slice::<Value>(&answered)
            .ok()
            .and_then(|v| v.get("kv_transfer_params").cloned())
            .unwrap_or(Value::Null);
        let mut decode = original;
        decode["kv_transfer_params"] = params;
        self.send(
            self.decode.to_string(),
            &path,
            &headers,
            Bytes::from(decode.to_string()),
        )
        .await
    }

    /// POSTs `body` to `target` with the client's headers (less those the body and the
    /// target decide), the answer streamed back as it comes.
    async fn send(&self, target: String, path: &str, headers: &HeaderMap, body: Bytes) -> Response<Body> {
        let mut request = Request::post(format!("http://{target}{path}"))
            .body(Full::new(body))
            .unwrap();
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
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync())
        .unwrap()
}
