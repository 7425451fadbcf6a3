//! Transparency and robustness of the proxy: byte-identical streams, header handling,
//! target pinning, error answers, the request peek, h2c, the metrics port and shutdown.

use crate::common::*;
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Splits `bytes` into pieces of awkward sizes (cutting events, lines and UTF-8 sequences).
fn awkward_pieces(bytes: &[u8]) -> Vec<(Duration, Vec<u8>)> {
    let sizes = [1, 7, 64, 3, 200, 5, 333, 2];
    let mut pieces = Vec::new();
    let mut rest = bytes;
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (*size).min(rest.len());
        pieces.push((Duration::from_millis(1), rest[..n].to_vec()));
        rest = &rest[n..];
    }
    pieces
}

fn fixture_head(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap().trim_end().to_string()
}

#[tokio::test(start_paused = true)]
async fn client_receives_exactly_the_bytes_the_engine_sent() {
    for name in ["vllm-chat", "vllm-completions", "vllm-chat-n2", "vllm-chat-eos"] {
        let sse = fixture(&format!("{name}.sse"));
        let head_file = if name == "vllm-completions" {
            "vllm-completions.headers"
        } else {
            "vllm-chat.headers"
        };
        let script = Script {
            head: fixture_head(head_file),
            ..Script::sse(awkward_pieces(&sse))
        };
        let (upstream, _) = scripted_upstream(script).await;
        let sidecar = start_sidecar(upstream, "").await;
        let path = if name == "vllm-completions" {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        // The captures were made with include_usage, and the client asks for it too: nothing is cut.
        let body = r#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true}}"#;
        let response = post(sidecar.proxy_addr, path, body.to_string()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream; charset=utf-8");
        assert_eq!(response.headers()["server"], "uvicorn");
        assert_eq!(response.headers()["vary"], "Origin");
        let received = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(received, Bytes::from(sse), "{name}: bytes differ");
        let m = settled(&sidecar).await;
        assert_eq!(
            sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
            1.0,
            "{name}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn role_chunk_alone_is_not_the_first_token() {
    let sse = fixture("vllm-chat.sse");
    let first_event_end = sse.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
    let script = Script::sse(vec![
        (Duration::ZERO, sse[..first_event_end].to_vec()),
        (Duration::from_millis(300), sse[first_event_end..].to_vec()),
    ]);
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    post_collect(sidecar.proxy_addr, "/v1/chat/completions", r#"{"model":"tiny"}"#.into()).await;
    let m = settled(&sidecar).await;
    let ttft = sample(
        &m,
        "gen_ai_server_time_to_first_token_seconds_sum",
        &[("model", "tiny")],
    );
    assert!(
        (ttft - 0.300).abs() < 0.002,
        "ttft {ttft}: the role chunk was taken as a token"
    );
    // N from the usage chunk.
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[("model", "tiny")]), 16.0);
    assert_eq!(sample(&m, "llmslo_input_tokens_total", &[("model", "tiny")]), 11.0);
}

#[tokio::test(start_paused = true)]
async fn stream_without_done_is_an_upstream_error() {
    let mut sse = fixture("vllm-chat-nousage.sse");
    sse.truncate(sse.len() - b"data: [DONE]\n\n".len());
    let (upstream, _) = scripted_upstream(Script::sse(vec![(Duration::ZERO, sse)])).await;
    let sidecar = start_sidecar(upstream, "").await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", "{}".into()).await;
    assert_eq!(status, 200);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "upstream_error")]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn oversized_event_stops_measuring_but_not_forwarding() {
    let mut sse =
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\""
            .to_vec();
    sse.extend(std::iter::repeat_n(b'x', 8 * 1024));
    sse.extend_from_slice(b"\"}}]}\n\ndata: [DONE]\n\n");
    let (upstream, _) = scripted_upstream(Script::sse(awkward_pieces(&sse))).await;
    let sidecar = start_sidecar(upstream, "max_event_bytes: 4096\n").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", "{}".into()).await;
    assert_eq!(status, 200);
    assert_eq!(body, Bytes::from(sse));
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &[]), 1.0);
}

#[tokio::test]
async fn end_to_end_headers_pass_and_hop_by_hop_headers_do_not() {
    let (upstream, received) =
        scripted_upstream(Script::sse(vec![(Duration::ZERO, b"data: [DONE]\n\n".to_vec())])).await;
    let sidecar = start_sidecar(upstream, "").await;
    let request = Request::post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .header(header::HOST, "chat.example.com")
        .header(header::AUTHORIZATION, "Bearer sk-test")
        .header(header::CONNECTION, "x-hop")
        .header("x-hop", "secret-to-this-hop")
        .header("x-forwarded-for", "198.51.100.7")
        .header("x-request-id", "abc")
        .body(Full::new(Bytes::from_static(b"{\"model\":\"m\",\"stream\":false}")))
        .unwrap();
    let response = client().request(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    let head = request_to(&received, "POST ").to_ascii_lowercase();
    assert!(head.starts_with("post /v1/chat/completions http/1.1\r\n"), "{head}");
    assert!(head.contains("host: chat.example.com\r\n"), "{head}");
    assert!(head.contains("authorization: bearer sk-test\r\n"));
    assert!(head.contains("x-request-id: abc\r\n"));
    assert!(head.contains("x-forwarded-for: 198.51.100.7, 127.0.0.1\r\n"), "{head}");
    assert!(!head.contains("x-hop"), "{head}");
    assert!(
        head.ends_with("{\"model\":\"m\",\"stream\":false}"),
        "non-streaming bodies are untouched"
    );
}

#[tokio::test]
async fn absolute_uri_and_foreign_host_still_go_to_the_configured_upstream() {
    let (upstream, received) = scripted_upstream(Script {
        head: "HTTP/1.1 200 OK\r\ncontent-length: 2".into(),
        pieces: vec![(Duration::ZERO, b"ok".to_vec())],
        ..Script::sse(Vec::new())
    })
    .await;
    let sidecar = start_sidecar(upstream, "").await;
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream
        .write_all(b"GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"));
    let head = request_to(&received, "GET /latest");
    assert!(head.starts_with("GET /latest/meta-data HTTP/1.1\r\n"), "{head}");

    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream
        .write_all(b"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(answer.contains("method_not_allowed"));
    let log = received.lock().unwrap();
    assert!(
        !log.iter().any(|r| r.starts_with(b"CONNECT")),
        "CONNECT never reaches the upstream"
    );
}

#[tokio::test]
async fn upstream_down_gives_502_json_and_connect_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let sidecar = start_sidecar(closed, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
    assert_eq!(status, 502);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["type"], "upstream_unavailable");
    assert!(json["error"]["message"].as_str().unwrap().contains("refused"), "{json}");
    let body = String::from_utf8_lossy(&body);
    assert!(
        !body.contains(&closed.to_string()) && !body.contains("127.0.0.1"),
        "the client is never told where the engine is: {body}"
    );
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("outcome", "connect_error"), ("model", "other")]
        ),
        1.0,
        "a model the engine never answered is not learned"
    );
    assert_eq!(sample(&m, "llmslo_requests_in_flight", &[]), 0.0);
    // Other paths are forwarded (and fail) the same way, without being measured.
    let (status, _) = post_collect(sidecar.proxy_addr, "/other", "{}".into()).await;
    assert_eq!(status, 502);
    assert_eq!(sample(&sidecar.metrics.encode(), "llmslo_requests_total", &[]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn silent_upstream_gives_504_and_timeout() {
    let (upstream, _) = scripted_upstream(Script {
        silent: true,
        ..Script::sse(vec![])
    })
    .await;
    let sidecar = start_sidecar(upstream, "upstream_timeout: 2s\n").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
    assert_eq!(status, 504);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["type"], "upstream_timeout");
    let m = sidecar.metrics.encode();
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "timeout")]), 1.0);
    // The one request, a timeout: its end to end is the upstream timeout.
    let e2e = sample(&m, "gen_ai_server_request_duration_seconds_sum", &[]);
    assert!((e2e - 2.0).abs() < 0.01, "{e2e}");
}

/// An engine serving two models: a request whose body cannot be read is `unknown` however
/// soon the sidecar learns them (an engine's only model would name it).
fn two_models() -> llmslo::tools::simulate::SimOptions {
    llmslo::tools::simulate::SimOptions {
        models: vec!["sim".into(), "sim-b".into()],
        ..timed_engine(5, 1)
    }
}

#[tokio::test(start_paused = true)]
async fn body_over_the_peek_limit_is_forwarded_intact_with_model_unknown() {
    let (engine, _stop) = start_engine(two_models()).await;
    let (upstream, received) =
        scripted_upstream(Script::sse(vec![(Duration::ZERO, b"data: [DONE]\n\n".to_vec())])).await;
    for (target, expect_model) in [(engine, "unknown"), (upstream, "unknown")] {
        let sidecar = start_sidecar(target, "max_peek_bytes: 1024\n").await;
        let padding = "word ".repeat(1000);
        let body = serde_json::json!({
            "model": "sim", "stream": true, "max_tokens": 3,
            "messages": [{"role": "user", "content": padding}],
        })
        .to_string();
        let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", body.clone()).await;
        assert_eq!(status, 200);
        let m = settled(&sidecar).await;
        assert_eq!(sample(&m, "llmslo_requests_total", &[("model", expect_model)]), 1.0);
        if target == upstream {
            let raw = request_to(&received, "POST ");
            assert!(raw.ends_with(&body), "the body was altered");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_json_is_forwarded_and_the_engines_4xx_is_client_error() {
    let (engine, _stop) = start_engine(two_models()).await;
    let sidecar = start_sidecar(engine, "").await;
    let (status, body) = post_collect(
        sidecar.proxy_addr,
        "/v1/chat/completions",
        "{\"model\": \"sim\",".into(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("invalid JSON"));
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", r#"{"model":"nope"}"#.into()).await;
    assert_eq!(status, 404);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("outcome", "client_error"), ("model", "unknown")]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("outcome", "client_error"), ("model", "other")]
        ),
        1.0,
        "a model the engine rejects takes no label"
    );
    assert!(!m.contains("model=\"nope\""), "{m}");
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("outcome", "client_error"), ("model", "nope")]
        ),
        0.0
    );
}

#[tokio::test(start_paused = true)]
async fn h2c_clients_are_proxied_and_measured() {
    let (engine, _stop) = start_engine(timed_engine(40, 10)).await;
    let sidecar = start_sidecar(engine, "").await;
    let h2 = h2c_client();
    let request = Request::post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .body(Full::new(Bytes::from(chat_body(5, true, true))))
        .unwrap();
    let response = h2.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let m = settled(&sidecar).await;
    let ttft = sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &[("model", "sim")]);
    assert!((ttft - 0.040).abs() < 0.001, "{ttft}");
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[("model", "sim")]), 5.0);
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (StatusCode, Option<http::HeaderValue>, Bytes) {
    get_with(Request::get(format!("http://{addr}{path}"))).await
}

#[tokio::test]
async fn metrics_port_serves_protobuf_to_a_scraper_that_prefers_it() {
    use prost::Message;
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "engine: vllm\n").await;
    assert_eq!(
        post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, true))
            .await
            .0,
        200
    );
    settle(&sidecar).await;
    let accept = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
                  text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let request = Request::get(format!("http://{}/metrics", sidecar.metrics_addr))
        .header(header::ACCEPT, accept)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
    );
    assert_eq!(response.headers()[header::VARY], "Accept");
    let mut body = &response.into_body().collect().await.unwrap().to_bytes()[..];
    let mut families = Vec::new();
    while !body.is_empty() {
        families.push(llmslo::proto::MetricFamily::decode_length_delimited(&mut body).unwrap());
    }
    let tpot = families
        .iter()
        .find(|f| f.name == "gen_ai_server_time_per_output_token_seconds")
        .expect("TPOT in the protobuf exposition");
    let measured = tpot
        .metric
        .iter()
        .filter_map(|m| m.histogram.as_ref())
        .find(|h| h.sample_count == 1)
        .expect("the request's TPOT");
    assert_eq!(measured.schema, 4, "native buckets");
    assert_eq!(measured.positive_delta, [1], "one observation, one native bucket");
    assert!(measured.bucket.len() > 30, "and the classic buckets");
    assert!(families.iter().any(|f| f.name == "llmslo_build_info"));
    // The text exposition is unchanged for everyone else.
    let (_, content_type, _) = get_accepting(sidecar.metrics_addr, "/metrics", PROMETHEUS_TEXT_ACCEPT).await;
    assert!(content_type
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
}

/// What a Prometheus without native histograms asks for.
const PROMETHEUS_TEXT_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
     version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

async fn get_accepting(
    addr: std::net::SocketAddr,
    path: &str,
    accept: &str,
) -> (StatusCode, Option<http::HeaderValue>, Bytes) {
    get_with(Request::get(format!("http://{addr}{path}")).header(header::ACCEPT, accept)).await
}

/// Sends a GET built as `request`; its status, content type and body.
async fn get_with(request: http::request::Builder) -> (StatusCode, Option<http::HeaderValue>, Bytes) {
    let response = client()
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    (
        status,
        content_type,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// Polls `path` until it answers `want`, for up to 2.5 s.
async fn turns(addr: std::net::SocketAddr, path: &str, want: StatusCode) -> bool {
    for _ in 0..50 {
        if get(addr, path).await.0 == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn metrics_port_serves_openmetrics_health_and_readiness() {
    let (engine, stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "health_interval: 100ms\n").await;
    let metrics = sidecar.metrics_addr;
    let (status, content_type, body) = get_accepting(metrics, "/metrics", PROMETHEUS_TEXT_ACCEPT).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type.unwrap(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("# TYPE llmslo_requests_refused counter"));
    assert!(text.contains("llmslo_build_info{version=\"0.1.0\"} 1"));
    assert!(text.ends_with("# EOF\n"));
    // curl (`*/*`) and a client with no preference get the classic text format, which
    // names a counter family with its `_total`.
    for accept in ["*/*", "text/plain;version=0.0.4"] {
        let (_, content_type, body) = get_accepting(metrics, "/metrics", accept).await;
        assert_eq!(content_type.unwrap(), "text/plain; version=0.0.4; charset=utf-8");
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("# TYPE llmslo_requests_refused_total counter"),
            "{accept}"
        );
        assert!(text.contains("# TYPE llmslo_build_info gauge"));
        assert!(!text.contains("# EOF") && !text.contains("_created"));
    }
    let (_, content_type, _) = get(metrics, "/metrics").await;
    assert_eq!(content_type.unwrap(), "text/plain; version=0.0.4; charset=utf-8");
    assert_eq!(get(metrics, "/healthz").await.0, StatusCode::OK);
    assert_eq!(get(metrics, "/nope").await.0, StatusCode::NOT_FOUND);
    assert!(
        turns(metrics, "/readyz", StatusCode::OK).await,
        "/readyz never turned ready with the engine up"
    );
    stop.cancel();
    assert!(
        turns(metrics, "/readyz", StatusCode::SERVICE_UNAVAILABLE).await,
        "/readyz stayed ready with the engine down"
    );
    assert_eq!(
        get(metrics, "/healthz").await.0,
        StatusCode::OK,
        "the process is still healthy"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_in_flight_streams_finish_and_refuses_new_connections() {
    let (engine, _stop) = start_engine(timed_engine(100, 50)).await;
    let sidecar = start_sidecar(engine, "drain_timeout: 30s\n").await;
    let (proxy, metrics_addr) = (sidecar.proxy_addr, sidecar.metrics_addr);
    let metrics = sidecar.metrics.clone();
    let stream = |tokens| {
        tokio::spawn(async move { post_collect(proxy, "/v1/chat/completions", chat_body(tokens, true, false)).await })
    };
    let (short, long) = (stream(10), stream(40));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = tokio::spawn(sidecar.shutdown());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(TcpStream::connect(proxy).await.is_err(), "the listener is closed");
    let (status, body) = short.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        body.ends_with(b"data: [DONE]\n\n"),
        "the stream finished during the drain"
    );
    // While the long stream drains, /metrics still answers, with the short one counted.
    let request = Request::get(format!("http://{metrics_addr}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client()
        .request(request)
        .await
        .expect("/metrics answers during the drain");
    let scraped = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert_eq!(
        sample(&scraped, "llmslo_requests_total", &[("outcome", "success")]),
        1.0
    );
    assert_eq!(sample(&scraped, "llmslo_requests_in_flight", &[]), 1.0);
    assert_eq!(long.await.unwrap().0, 200);
    stopping.await.unwrap();
    assert_eq!(
        sample(&metrics.encode(), "llmslo_requests_total", &[("outcome", "success")]),
        2.0
    );
}

#[tokio::test(start_paused = true)]
async fn captured_vllm_error_answers_are_client_errors() {
    for name in ["vllm-error-badmodel", "vllm-error-too-long"] {
        let body = fixture(&format!("{name}.body"));
        let script = Script {
            head: fixture_head(&format!("{name}.headers")),
            pieces: vec![(Duration::ZERO, body.clone())],
            ..Script::sse(Vec::new())
        };
        let (upstream, _) = scripted_upstream(script).await;
        let sidecar = start_sidecar(upstream, "").await;
        let (status, received) = post_collect(
            sidecar.proxy_addr,
            "/v1/chat/completions",
            r#"{"model":"tiny","stream":true}"#.into(),
        )
        .await;
        assert!(status == 400 || status == 404, "{name}: {status}");
        assert_eq!(received, Bytes::from(body), "{name}");
        let m = settled(&sidecar).await;
        assert_eq!(
            sample(&m, "llmslo_requests_total", &[("outcome", "client_error")]),
            1.0,
            "{name}"
        );
    }
}

#[tokio::test]
async fn oversized_request_head_is_refused_and_the_proxy_keeps_serving() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "").await;
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    let huge = "a".repeat(100 * 1024);
    let request = format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large"),
        "{answer}"
    );
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, false)).await;
    assert_eq!(status, 200, "other clients are unaffected");
}

#[tokio::test]
async fn a_request_that_begins_with_a_lone_byte_is_still_served() {
    // One byte cannot tell HTTP/1.1 from the h2c preface: hyper-util's sniff takes over.
    let (engine, _stop) = start_engine(timed_engine(2, 1)).await;
    let sidecar = start_sidecar(engine, "").await;
    let body = chat_body(2, true, false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream.write_all(&request.as_bytes()[..1]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    stream.write_all(&request.as_bytes()[1..]).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("data: [DONE]"), "{answer}");
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn slow_request_head_is_timed_out() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "").await;
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let started = tokio::time::Instant::now();
    let _ = stream.read_to_end(&mut answer).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, false)).await;
    assert_eq!(status, 200);
}

#[tokio::test(start_paused = true)]
async fn client_leaving_before_the_response_head_is_client_cancelled() {
    let (upstream, received) = scripted_upstream(Script {
        silent: true,
        ..Script::sse(vec![])
    })
    .await;
    let sidecar = start_sidecar(upstream, "").await;
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    let body = chat_body(4, true, false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    while !received.lock().unwrap().iter().any(|r| r.starts_with(b"POST")) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sample(&sidecar.metrics.encode(), "llmslo_requests_in_flight", &[]), 1.0);
    drop(stream);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "client_cancelled")]),
        1.0
    );
}

/// The real vLLM chat capture made with include_usage, and what vLLM sends without it.
fn capture_with_and_without_usage() -> (Vec<u8>, Vec<u8>) {
    with_and_without_usage("vllm-chat.sse")
}

#[tokio::test(start_paused = true)]
async fn injected_usage_request_is_answered_and_hidden_byte_for_byte() {
    let (with_usage, without_usage) = capture_with_and_without_usage();
    let (upstream, received) = scripted_upstream_by(move |request| {
        let asked = String::from_utf8_lossy(request).contains("\"include_usage\":true");
        let body = if asked { &with_usage } else { &without_usage };
        Script::sse(awkward_pieces(body))
    })
    .await;
    let sidecar = start_sidecar(upstream, "").await;
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    let (status, got) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", body.into()).await;
    assert_eq!(status, 200);
    assert_eq!(
        got,
        Bytes::from(capture_with_and_without_usage().1),
        "the client sees what it would have seen"
    );
    let sent = request_to(&received, "POST ");
    assert!(
        sent.ends_with(&format!(
            "{{\"stream_options\":{{\"include_usage\":true}},{}",
            &body[1..]
        )),
        "{sent}"
    );
    assert!(
        sent.to_ascii_lowercase()
            .contains(&format!("content-length: {}\r\n", body.len() + 40)),
        "{sent}"
    );
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &[("model", "tiny")]),
        16.0,
        "N from the usage"
    );
    assert_eq!(sample(&m, "llmslo_input_tokens_total", &[("model", "tiny")]), 11.0);
}

#[tokio::test(start_paused = true)]
async fn usage_the_client_asked_for_is_left_alone_and_injection_can_be_turned_off() {
    let (with_usage, without_usage) = capture_with_and_without_usage();
    let (upstream, received) = scripted_upstream_by(move |request| {
        let asked = String::from_utf8_lossy(request).contains("\"include_usage\":true");
        Script::sse(vec![(
            Duration::ZERO,
            if asked {
                with_usage.clone()
            } else {
                without_usage.clone()
            },
        )])
    })
    .await;
    let off = start_sidecar(upstream, "inject_usage: false\n").await;
    let body = r#"{"model":"tiny","stream":true}"#;
    let (_, got) = post_collect(off.proxy_addr, "/v1/chat/completions", body.into()).await;
    assert_eq!(got, Bytes::from(capture_with_and_without_usage().1));
    assert!(request_to(&received, "POST ").ends_with(body), "forwarded untouched");
    let m = settled(&off).await;
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &[("model", "tiny")]),
        0.0,
        "without usage the count is unknown"
    );
    assert_eq!(
        sample(&m, "llmslo_token_count_source_total", &[("source", "events")]),
        1.0
    );
    assert_eq!(
        sample(&m, "llmslo_input_tokens_total", &[("model", "tiny")]),
        0.0,
        "no usage, no input count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_engine_within_3_seconds_both_ways() {
    use llmslo::tools::simulate::SimEngine;
    let (engine, stop) = start_engine(timed_engine(1, 1)).await;
    // The default health_interval.
    let sidecar = start_sidecar(engine, "").await;
    let metrics = sidecar.metrics_addr;
    let within = |seconds: u64, want: StatusCode| async move {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(seconds) {
            if get(metrics, "/readyz").await.0 == want {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("/readyz was not {want} within {seconds} s");
    };
    within(5, StatusCode::OK).await;
    stop.cancel();
    let down = within(3, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(
        get(metrics, "/healthz").await.0,
        StatusCode::OK,
        "liveness never follows the engine"
    );
    let listener = tokio::net::TcpListener::bind(engine).await.unwrap();
    let again = tokio_util::sync::CancellationToken::new();
    tokio::spawn(SimEngine::new(timed_engine(1, 1)).serve(listener, again.clone()));
    let up = within(3, StatusCode::OK).await;
    eprintln!("unready {down:?} after the engine stopped, ready {up:?} after it came back");
    again.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failed_health_probe_does_not_make_the_pod_unready() {
    let probes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = probes.clone();
    // The fourth probe of /health fails; the rest succeed.
    let (engine, _) = scripted_upstream_by(move |request| {
        let mut script = Script::sse(vec![(Duration::ZERO, b"ok".to_vec())]);
        if request.starts_with(b"GET /health ") && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 3 {
            script.head = "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked".into();
        }
        script
    })
    .await;
    let sidecar = start_sidecar(engine, "health_interval: 100ms\n").await;
    let metrics = sidecar.metrics_addr;
    assert!(turns(metrics, "/readyz", StatusCode::OK).await);
    let mut statuses = Vec::new();
    while probes.load(std::sync::atomic::Ordering::SeqCst) < 8 {
        statuses.push(get(metrics, "/readyz").await.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_reach_the_engine_triggers_a_probe_at_once() {
    let (engine, stop) = start_engine(timed_engine(1, 1)).await;
    // Probes 30 s apart: only live traffic can tell the engine is gone in time.
    let sidecar = start_sidecar(engine, "health_interval: 30s\n").await;
    let metrics = sidecar.metrics_addr;
    assert!(turns(metrics, "/readyz", StatusCode::OK).await);
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 502);
    let started = std::time::Instant::now();
    while get(metrics, "/readyz").await.0 != StatusCode::SERVICE_UNAVAILABLE {
        assert!(started.elapsed() < Duration::from_secs(3), "/readyz still 200");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
