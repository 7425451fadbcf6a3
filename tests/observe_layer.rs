//! The observer as a tower layer, mounted in the axum gateway of `examples/observe_axum.rs`,
//! records exactly what the sidecar records for the same streams.

use crate::common;
#[allow(dead_code)] // the example's `main`
#[path = "../examples/observe_axum.rs"]
mod example;

use crate::common::*;
use llmslo::metrics::Metrics;
use llmslo::observe::recorder::RecorderSettings;
use llmslo::record::Engine;
use llmslo::{Measurement, MeasurementSettings};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The real vLLM capture, one event per chunk: the first after 120 ms, then every 25 ms.
fn paced_capture() -> Script {
    common::paced_capture(Duration::from_millis(120), Duration::from_millis(25))
}

/// The request families the sidecar records, as text (process-level ones left out).
fn request_families(text: &str) -> Vec<String> {
    // The process's own, the engine's traffic rate and mean in flight (per second of each
    // one's own clock since it started), and the engine's page the sidecar reads.
    const PROCESS: [&str; 7] = [
        "llmslo_build_info",
        "llmslo_config_",
        "llmslo_proxy_connections_open",
        "llmslo_upstream_",
        "llmslo_gpu_",
        "llmslo_capacity_load_",
        "llmslo_engine_scrape_",
    ];
    text.lines()
        .filter(|line| line.starts_with("llmslo_") || line.starts_with("gen_ai_"))
        .filter(|line| !PROCESS.iter().any(|p| line.starts_with(p)))
        .map(str::to_string)
        .collect()
}

async fn start_gateway(upstream: SocketAddr) -> (SocketAddr, Arc<Metrics>) {
    let measurement = Measurement::new(MeasurementSettings {
        recorder: RecorderSettings {
            engine: Some(Engine::Vllm),
            ..RecorderSettings::default()
        },
        ..MeasurementSettings::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = example::app(format!("http://{upstream}").parse().unwrap(), &measurement);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, measurement.metrics)
}

#[tokio::test(start_paused = true)]
async fn the_layer_in_an_axum_gateway_records_what_the_sidecar_records() {
    let (upstream, _) = scripted_upstream(paced_capture()).await;
    let sidecar = start_sidecar(upstream, "").await;
    let (gateway, gateway_metrics) = start_gateway(upstream).await;

    for addr in [sidecar.proxy_addr, gateway] {
        for (stream, usage) in [(true, false), (true, true), (false, false)] {
            let (status, body) = post_collect(addr, "/v1/chat/completions", chat_body(16, stream, usage)).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        }
        // Not a generation request: forwarded, not measured.
        let (status, _) = post_collect(addr, "/tokenize", "{}".into()).await;
        assert_eq!(status, 200);
    }
    settle(&sidecar).await;
    let from_sidecar = request_families(&sidecar.metrics.encode());
    let from_layer = request_families(&gateway_metrics.encode());
    assert!(
        from_sidecar
            .iter()
            .any(|l| l.starts_with("gen_ai_server_time_per_output_token_seconds_sum")),
        "{from_sidecar:?}"
    );
    assert_eq!(from_layer, from_sidecar);
    let text = gateway_metrics.encode();
    let ok = [("outcome", "success")];
    assert_eq!(sample(&text, "llmslo_requests_total", &ok), 3.0, "{text}");
    assert_eq!(
        sample(&text, "gen_ai_server_time_to_first_token_seconds_count", &[]),
        3.0
    );
    let ttft_sum = sample(&text, "gen_ai_server_time_to_first_token_seconds_sum", &[]);
    assert!(
        (ttft_sum - 3.0 * 0.145).abs() < 1e-9,
        "the first token is the capture's second event, 145 ms in: {ttft_sum}"
    );
    assert!(sample(&text, "llmslo_output_tokens_total", &[]) > 0.0);
}

#[tokio::test]
async fn the_layer_counts_an_engine_that_cannot_be_reached_and_answers_through_the_apps_handler() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (gateway, metrics) = start_gateway(closed).await;
    let (status, body) = post_collect(gateway, "/v1/chat/completions", chat_body(16, true, false)).await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    let text = metrics.encode();
    assert_eq!(
        sample(&text, "llmslo_requests_total", &[("outcome", "connect_error")]),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "llmslo_requests_in_flight", &[]), 0.0);
}

#[tokio::test]
async fn a_client_that_breaks_off_its_upload_is_counted_as_its_own_fault_and_the_engine_never_sees_it() {
    let (upstream, log) = scripted_upstream(paced_capture()).await;
    let (gateway, metrics) = start_gateway(upstream).await;
    let mut stream = tokio::net::TcpStream::connect(gateway).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"model\":\"m\",",
    )
    .await
    .unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut stream).await.unwrap();
    let _ = read_for(&mut stream, Duration::from_secs(2)).await;
    let mut text = metrics.encode();
    for _ in 0..100 {
        if sample(&text, "llmslo_requests_total", &[]) > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        text = metrics.encode();
    }
    assert_eq!(
        sample(&text, "llmslo_requests_total", &[("outcome", "client_cancelled")]),
        1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "llmslo_requests_total", &[]), 1.0);
    assert!(log.lock().unwrap().is_empty(), "the engine got nothing");
    // The gateway still serves the next client.
    let (status, _) = post_collect(gateway, "/v1/chat/completions", chat_body(16, true, false)).await;
    assert_eq!(status, 200);
}

/// What the engine below the layer answers with.
type Answer = http::Response<http_body_util::Full<bytes::Bytes>>;

/// Answers every request as a non-streaming chat completion of 3 tokens.
async fn answer(_request: http::Request<llmslo::proxy::UpstreamBody>) -> Result<Answer, std::convert::Infallible> {
    let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#;
    Ok(http::Response::builder()
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap())
}

#[tokio::test]
async fn on_a_decode_pod_a_decode_leg_comes_only_from_the_pod_itself_or_a_named_router() {
    use tower::ServiceExt;
    let measurement = Measurement::new(MeasurementSettings {
        role: llmslo::record::Role::Decode,
        ..MeasurementSettings::default()
    });
    let settings = llmslo::ObserveSettings {
        decode_leg_sources: vec!["10.8.0.0/16".parse().unwrap()],
        ..llmslo::ObserveSettings::default()
    };
    let layer = llmslo::ObserveLayer::new(measurement.recorder.clone(), settings);
    let leg = r#"{"model":"m","messages":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1]}}"#;
    for peer in ["10.0.0.7:41000", "127.0.0.1:41000", "10.8.3.4:41000", "[::1]:41000"] {
        let mut request = http::Request::post("http://engine/v1/chat/completions")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(leg)))
            .unwrap();
        let peer: SocketAddr = peer.parse().unwrap();
        request
            .extensions_mut()
            .insert(llmslo::proxy::forward::ClientAddr(peer));
        let response = tower::Layer::layer(&layer, tower::service_fn(answer))
            .oneshot(request)
            .await
            .unwrap();
        http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
    }
    let page = measurement.metrics.encode();
    // From outside the pod, a client's fields are no leg: the request is the user's, in full.
    assert_eq!(sample(&page, "llmslo_requests_total", &[]), 1.0, "{page}");
    assert_eq!(
        sample(&page, "llmslo_leg_fields_ignored_total", &[("phase", "decode")]),
        1.0
    );
    assert_eq!(sample(&page, "llmslo_output_tokens_total", &[]), 3.0);
    // From the pod itself (its routing sidecar) and from the router named: legs.
    assert_eq!(sample(&page, "llmslo_legs_total", &[("phase", "decode")]), 3.0);
}
