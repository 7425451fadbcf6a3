//! OpenTelemetry end to end: real OTLP receivers built from the OpenTelemetry protobuf
//! definitions (HTTP/protobuf and gRPC, on 127.0.0.1:0) get the spans and metrics of real
//! streams through the sidecar; the spans continue the client's traces and the engine is
//! handed llmslo's span; `/metrics` carries exemplars that name those traces; and a real
//! Prometheus with exemplar storage returns a slow request's exemplar.

use crate::common;

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// One HTTP export as it arrived, with its `authorization` header.
type Payload = (Bytes, Option<String>);

/// What a receiver was sent, decoded; and how many payloads it could not decode.
#[derive(Default, Clone)]
struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    metrics: Arc<Mutex<Vec<Metric>>>,
    /// Every resource's attributes, as `key=value`.
    resources: Arc<Mutex<Vec<String>>>,
    /// Every HTTP payload as it arrived.
    raw: Arc<Mutex<Vec<Payload>>>,
    undecodable: Arc<AtomicUsize>,
}

impl Received {
    fn take_traces(&self, request: ExportTraceServiceRequest) {
        for resource_spans in request.resource_spans {
            self.take_resource(resource_spans.resource);
            let spans = resource_spans.scope_spans.into_iter().flat_map(|s| s.spans);
            self.spans.lock().unwrap().extend(spans);
        }
    }

    fn take_metrics(&self, request: ExportMetricsServiceRequest) {
        for resource_metrics in request.resource_metrics {
            self.take_resource(resource_metrics.resource);
            let metrics = resource_metrics.scope_metrics.into_iter().flat_map(|s| s.metrics);
            self.metrics.lock().unwrap().extend(metrics);
        }
    }

    fn take_resource(&self, resource: Option<opentelemetry_proto::tonic::resource::v1::Resource>) {
        let attributes = resource.map(|r| r.attributes).unwrap_or_default();
        let mut resources = self.resources.lock().unwrap();
        for kv in &attributes {
            if let Some(value) = string_attribute(&attributes, &kv.key) {
                resources.push(format!("{}={value}", kv.key));
            }
        }
    }
}

/// An OTLP/HTTP receiver: protobuf bodies on `/v1/traces` and `/v1/metrics`.
async fn http_receiver() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let state = received.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let state = state.clone();
                    async move {
                        let path = request.uri().path().to_string();
                        let authorization = request
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string());
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        state.raw.lock().unwrap().push((body.clone(), authorization));
                        let decoded = match path.as_str() {
                            "/v1/traces" => ExportTraceServiceRequest::decode(body).map(|r| state.take_traces(r)),
                            "/v1/metrics" => ExportMetricsServiceRequest::decode(body).map(|r| state.take_metrics(r)),
                            _ => Ok(()),
                        };
                        let status = match decoded {
                            Ok(()) => 200,
                            Err(_) => {
                                state.undecodable.fetch_add(1, Ordering::SeqCst);
                                400
                            }
                        };
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(status)
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, received)
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.take_traces(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.take_metrics(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver (tonic's decoder refuses what it cannot decode).
async fn grpc_receiver() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(received.clone()))
        .add_service(MetricsServiceServer::new(received.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    (addr, received)
}

/// The real vLLM capture, paced: the first event after 60 ms, then one every 5 ms.
fn paced_capture() -> Script {
    common::paced_capture(Duration::from_millis(60), Duration::from_millis(5))
}

/// The capture's `usage.completion_tokens`.
fn capture_output_tokens() -> i64 {
    let text = String::from_utf8(fixture("vllm-chat.sse")).unwrap();
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|e| e["usage"]["completion_tokens"].as_i64());
    usage.expect("the capture reports usage")
}

const TRACE_IDS: [&str; 3] = [
    "4bf92f3577b34da6a3ce929d0e0e4736",
    "0af7651916cd43dd8448eb211c80319c",
    "5d1e2d3c4b5a69788796a5b4c3d2e1f0",
];
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// POSTs a streamed chat request, with a sampled `traceparent` when `trace` is given.
async fn chat(addr: SocketAddr, trace: Option<&str>) -> u16 {
    let mut request =
        Request::post(format!("http://{addr}/v1/chat/completions")).header("content-type", "application/json");
    if let Some(trace) = trace {
        request = request.header("traceparent", format!("00-{trace}-{CLIENT_SPAN}-01"));
    }
    let request = request.body(Full::new(Bytes::from(chat_body(8, true, true)))).unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status().as_u16();
    response.into_body().collect().await.unwrap();
    status
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key) {
        Some(AnyValue::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The highest count any export reported for histogram `name` (exports are cumulative).
fn histogram_count(metrics: &[Metric], name: &str) -> u64 {
    metrics
        .iter()
        .filter(|m| m.name == name)
        .filter_map(|m| match &m.data {
            Some(Data::Histogram(h)) => Some(h.data_points.iter().map(|p| p.count).sum::<u64>()),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The highest total any export reported for counter `name` where `key` is `value`.
fn counter_total(metrics: &[Metric], name: &str, key: &str, value: &str) -> i64 {
    metrics
        .iter()
        .filter(|m| m.name == name)
        .filter_map(|m| match &m.data {
            Some(Data::Sum(sum)) => Some(
                sum.data_points
                    .iter()
                    .filter(|p| string_attribute(&p.attributes, key).as_deref() == Some(value))
                    .map(|p| match p.value {
                        Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => n,
                        _ => 0,
                    })
                    .sum::<i64>(),
            ),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// A sidecar in front of the paced vLLM capture, exporting to a fresh OTLP/HTTP receiver with
/// the `otel:` keys `keys` (the endpoint added); the receiver's findings and the engine's log.
async fn exporting_sidecar(keys: &str) -> (llmslo::sidecar::Sidecar, Received, Arc<Mutex<Vec<Vec<u8>>>>) {
    let (receiver, received) = http_receiver().await;
    let (upstream, engine_log) = scripted_upstream(paced_capture()).await;
    let otel = format!("otel: {{{keys}, exporter_otlp_endpoint: 'http://{receiver}'}}\n");
    (start_sidecar(upstream, &otel).await, received, engine_log)
}

/// Streams four requests (three continuing client traces, one without) through a sidecar that
/// exports to `receiver` over `protocol`, shuts the sidecar down (which flushes the export),
/// and checks every span and metric that arrived.
async fn spans_and_metrics_arrive(protocol: &str, receiver: SocketAddr, received: Received) {
    let (upstream, engine_log) = scripted_upstream(paced_capture()).await;
    let sidecar = start_sidecar(
        upstream,
        &format!(
            "otel: {{traces_exporter: otlp, metrics_exporter: otlp, exporter_otlp_protocol: {protocol}, \
             exporter_otlp_endpoint: 'http://{receiver}', metric_export_interval: 200, service_name: chat-gateway}}\n"
        ),
    )
    .await;
    for trace in TRACE_IDS {
        assert_eq!(chat(sidecar.proxy_addr, Some(trace)).await, 200);
    }
    assert_eq!(chat(sidecar.proxy_addr, None).await, 200);
    let registry = sidecar.metrics.clone();
    settle(&sidecar).await;
    sidecar.shutdown().await;

    assert_eq!(
        received.undecodable.load(Ordering::SeqCst),
        0,
        "{protocol}: every export decodes"
    );
    let spans = received.spans.lock().unwrap().clone();
    assert_eq!(
        spans.len(),
        4,
        "{protocol}: one span per generation request: {spans:#?}"
    );
    let engine_requests: Vec<String> = engine_log
        .lock()
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .filter(|r| r.starts_with("POST /v1/chat/completions"))
        .collect();
    let exposition = registry.encode();
    for span in &spans {
        assert_eq!(span.name, "chat sim", "{protocol}");
        assert_eq!(span.kind, SpanKind::Server as i32, "{protocol}");
        let trace_id = hex(&span.trace_id);
        let span_id = hex(&span.span_id);
        let attributes = &span.attributes;
        for (key, value) in [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "sim"),
            ("gen_ai.provider.name", "vllm"),
            ("llmslo.outcome", "success"),
            ("llmslo.time_per_output_token.basis", "stream"),
        ] {
            assert_eq!(
                string_attribute(attributes, key).as_deref(),
                Some(value),
                "{protocol}: {key}"
            );
        }
        assert_eq!(
            attribute(attributes, "gen_ai.usage.output_tokens"),
            Some(&AnyValue::IntValue(capture_output_tokens()))
        );
        match attribute(attributes, "gen_ai.server.time_to_first_token") {
            Some(AnyValue::DoubleValue(ttft)) => assert!((0.06..1.0).contains(ttft), "{ttft}"),
            other => panic!("{protocol}: no TTFT on the span: {other:?}"),
        }
        assert!(span.events.iter().any(|e| e.name == "gen_ai.first_token"));
        // Without reasoning, the first answer token is the first token.
        assert_eq!(
            attribute(attributes, "llmslo.time_to_first_answer_token"),
            attribute(attributes, "gen_ai.server.time_to_first_token"),
            "{protocol}"
        );
        assert!(span.events.iter().any(|e| e.name == "llmslo.first_answer_token"));
        // The engine was handed llmslo's span as its parent, in the same trace.
        let handed = format!("traceparent: 00-{trace_id}-{span_id}-01");
        assert!(
            engine_requests.iter().any(|r| r.to_ascii_lowercase().contains(&handed)),
            "{protocol}: the engine never got {handed}"
        );
        match TRACE_IDS.iter().find(|t| **t == trace_id) {
            Some(_) => assert_eq!(
                hex(&span.parent_span_id),
                CLIENT_SPAN,
                "the client's span is the parent"
            ),
            None => assert!(span.parent_span_id.is_empty(), "a request without a trace starts one"),
        }
    }
    // Each bucket keeps its latest observation's exemplar: every one names an exported span.
    let exemplars: Vec<&str> = exposition
        .lines()
        .filter_map(|l| l.split_once(" # {").map(|(_, e)| e))
        .collect();
    assert!(!exemplars.is_empty(), "{protocol}: no exemplars on /metrics");
    for exemplar in exemplars {
        assert!(
            spans.iter().any(|s| exemplar.starts_with(&format!(
                "trace_id=\"{}\",span_id=\"{}\"",
                hex(&s.trace_id),
                hex(&s.span_id)
            ))),
            "{protocol}: the exemplar {exemplar} names no exported span"
        );
    }
    let continued = spans
        .iter()
        .filter(|s| TRACE_IDS.contains(&hex(&s.trace_id).as_str()))
        .count();
    assert_eq!(continued, 3, "{protocol}: each client trace is continued");

    let metrics = received.metrics.lock().unwrap().clone();
    for name in [
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
        "llmslo.time_to_first_answer_token",
    ] {
        assert_eq!(histogram_count(&metrics, name), 4, "{protocol}: {name}");
    }
    assert_eq!(
        histogram_count(&metrics, "gen_ai.client.token.usage"),
        8,
        "input and output"
    );
    assert_eq!(
        counter_total(&metrics, "llmslo.requests", "llmslo.outcome", "success"),
        4
    );
    assert_eq!(
        counter_total(&metrics, "llmslo.output_tokens", "gen_ai.request.model", "sim"),
        4 * capture_output_tokens()
    );
    let ttft = metrics
        .iter()
        .find(|m| m.name == "gen_ai.server.time_to_first_token")
        .unwrap();
    assert_eq!(ttft.unit, "s");
    let Some(Data::Histogram(histogram)) = &ttft.data else {
        panic!("TTFT is a histogram")
    };
    let point = &histogram.data_points[0];
    assert_eq!(
        string_attribute(&point.attributes, "gen_ai.provider.name").as_deref(),
        Some("vllm")
    );
    assert!(
        point.explicit_bounds.contains(&0.5),
        "the same buckets as /metrics: {:?}",
        point.explicit_bounds
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_protobuf_export_carries_spans_and_metrics() {
    let (receiver, received) = http_receiver().await;
    spans_and_metrics_arrive("http/protobuf", receiver, received).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_grpc_export_carries_spans_and_metrics() {
    let (receiver, received) = grpc_receiver().await;
    spans_and_metrics_arrive("grpc", receiver, received).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_own_phases_are_exported_too() {
    // The real vLLM capture that states its own per-request metrics beside its usage.
    let text = String::from_utf8(fixture("apis/chat-per-request-metrics.sse")).unwrap();
    // The first event after the engine's own time to first token (69 ms), as it came.
    let pieces = text
        .split_inclusive("\n\n")
        .enumerate()
        .map(|(i, event)| {
            (
                Duration::from_millis(if i == 0 { 100 } else { 2 }),
                event.as_bytes().to_vec(),
            )
        })
        .collect();
    let (receiver, received) = http_receiver().await;
    let (upstream, _) = scripted_upstream(Script::sse(pieces)).await;
    let otel = format!(
        "otel: {{metrics_exporter: otlp, metric_export_interval: 200, exporter_otlp_endpoint: 'http://{receiver}'}}\n"
    );
    let sidecar = start_sidecar(upstream, &otel).await;
    assert_eq!(chat(sidecar.proxy_addr, None).await, 200);
    settle(&sidecar).await;
    sidecar.shutdown().await;
    let metrics = received.metrics.lock().unwrap().clone();
    for name in [
        "llmslo.engine.queue_time",
        "llmslo.engine.prefill_time",
        "llmslo.engine.time_to_first_token",
        "llmslo.time_outside_engine",
        "llmslo.engine.time_per_output_token",
    ] {
        assert_eq!(histogram_count(&metrics, name), 1, "{name}");
    }
    assert_eq!(
        histogram_count(&metrics, "llmslo.engine.draft_acceptance_ratio"),
        0,
        "the capture states no speculation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exponential_histograms_on_request_carry_every_observation() {
    let (sidecar, received, _) = exporting_sidecar(
        "metrics_exporter: otlp, metric_export_interval: 200, \
         exporter_otlp_metrics_default_histogram_aggregation: base2_exponential_bucket_histogram",
    )
    .await;
    for _ in 0..3 {
        assert_eq!(chat(sidecar.proxy_addr, None).await, 200);
    }
    settle(&sidecar).await;
    sidecar.shutdown().await;

    let metrics = received.metrics.lock().unwrap().clone();
    for name in [
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
        "gen_ai.client.token.usage",
        "llmslo.inter_chunk_latency",
    ] {
        let points: Vec<_> = metrics
            .iter()
            .filter(|m| m.name == name)
            .map(|m| match &m.data {
                Some(Data::ExponentialHistogram(h)) => h.data_points.clone(),
                other => panic!("{name} is exported as {other:?}"),
            })
            .max_by_key(|points| points.iter().map(|p| p.count).sum::<u64>())
            .unwrap_or_else(|| panic!("{name} was exported"));
        let point = points.iter().max_by_key(|p| p.count).unwrap();
        let in_buckets: u64 = point.zero_count + point.positive.as_ref().map_or(0, |b| b.bucket_counts.iter().sum());
        assert!(point.count > 0, "{name}");
        assert_eq!(in_buckets, point.count, "{name}: every observation is in a bucket");
        assert!(
            point.scale > 0,
            "{name}: finer than powers of two: scale {}",
            point.scale
        );
    }
    assert_eq!(
        histogram_count(&metrics, "gen_ai.server.time_to_first_token"),
        0,
        "no explicit buckets"
    );
}

#[tokio::test]
async fn without_export_the_exemplars_name_the_clients_sampled_trace_and_nothing_changes_upstream() {
    let (upstream, engine_log) = scripted_upstream(paced_capture()).await;
    let sidecar = start_sidecar(upstream, "").await;
    assert_eq!(chat(sidecar.proxy_addr, Some(TRACE_IDS[0])).await, 200);
    let unsampled = Request::post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{}-{CLIENT_SPAN}-00", TRACE_IDS[1]))
        .body(Full::new(Bytes::from(chat_body(8, true, true))))
        .unwrap();
    client()
        .request(unsampled)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let exposition = settled(&sidecar).await;
    let exemplar = format!("# {{trace_id=\"{}\",span_id=\"{CLIENT_SPAN}\"}}", TRACE_IDS[0]);
    for family in [
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "gen_ai_server_request_duration_seconds_bucket",
    ] {
        assert!(
            exposition
                .lines()
                .any(|l| l.starts_with(family) && l.contains(&exemplar)),
            "{family} has no exemplar for the sampled trace:\n{exposition}"
        );
    }
    assert!(!exposition.contains(TRACE_IDS[1]), "an unsampled trace is no exemplar");
    // The client's own trace headers reach the engine untouched.
    let first = request_to(&engine_log, "POST /v1/chat/completions").to_ascii_lowercase();
    assert!(first.contains(&format!("traceparent: 00-{}-{CLIENT_SPAN}-01", TRACE_IDS[0])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampler_that_drops_the_trace_exports_no_span_and_leaves_no_exemplar() {
    let (sidecar, received, engine_log) =
        exporting_sidecar("traces_exporter: otlp, metrics_exporter: otlp, traces_sampler: always_off").await;
    assert_eq!(chat(sidecar.proxy_addr, Some(TRACE_IDS[1])).await, 200);
    let registry = sidecar.metrics.clone();
    settle(&sidecar).await;
    sidecar.shutdown().await;
    assert!(received.spans.lock().unwrap().is_empty(), "always_off exports no span");
    assert_eq!(
        histogram_count(&received.metrics.lock().unwrap(), "gen_ai.server.time_to_first_token"),
        1,
        "metrics are exported whatever the sampler says"
    );
    assert!(!registry.encode().contains(" # {"), "an unsampled span is no exemplar");
    // The engine still continues the client's trace, told it is not sampled.
    let request = request_to(&engine_log, "POST /v1/chat/completions").to_ascii_lowercase();
    assert!(
        request.contains(&format!("traceparent: 00-{}-", TRACE_IDS[1])),
        "{request}"
    );
    assert!(request.contains("-00\r\n"), "{request}");
}

#[tokio::test]
async fn bad_otel_settings_stop_the_sidecar_with_the_key_named() {
    let (upstream, _) = scripted_upstream(paced_capture()).await;
    for (otel, key) in [
        ("{traces_exporter: zipkin}", "otel.traces_exporter"),
        (
            "{metrics_exporter: otlp, exporter_otlp_protocol: udp}",
            "otel.exporter_otlp_protocol",
        ),
    ] {
        let yaml =
            format!("upstream: http://{upstream}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\notel: {otel}\n");
        let error = llmslo::config::Config::from_yaml(&yaml).unwrap_err().to_string();
        assert!(error.contains(key), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_variables_alone_switch_export_on_and_no_prompt_is_exported() {
    const PROMPT_SECRET: &str = "prompt-secret-c41d";
    let (receiver, received) = http_receiver().await;
    let (upstream, _) = scripted_upstream(paced_capture()).await;
    let (proxy, metrics) = (free_port(), free_port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args(["run", "--upstream", &format!("http://{upstream}"), "--engine", "vllm"])
        .args(["--listen", &format!("127.0.0.1:{proxy}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .env("OTEL_TRACES_EXPORTER", "otlp")
        .env("OTEL_METRICS_EXPORTER", "otlp")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{receiver}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer collector-token")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "llm-gateway")
        .env("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=prod-eu")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let proxy_addr: SocketAddr = format!("127.0.0.1:{proxy}").parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(proxy_addr).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "the sidecar never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = serde_json::json!({
        "model": "sim", "stream": true,
        "messages": [{"role": "user", "content": format!("keep {PROMPT_SECRET} safe")}],
    });
    let request = Request::post(format!("http://{proxy_addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{}-{CLIENT_SPAN}-01", TRACE_IDS[0]))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    client()
        .request(request)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while received.spans.lock().unwrap().is_empty()
        || histogram_count(&received.metrics.lock().unwrap(), "gen_ai.server.time_to_first_token") == 0
    {
        assert!(std::time::Instant::now() < deadline, "nothing exported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    terminate(&mut child);
    let span = received.spans.lock().unwrap()[0].clone();
    assert_eq!(hex(&span.trace_id), TRACE_IDS[0]);
    let resources = received.resources.lock().unwrap().clone();
    assert!(
        resources.contains(&"service.name=llm-gateway".to_string()),
        "{resources:?}"
    );
    assert!(
        resources.contains(&"k8s.cluster.name=prod-eu".to_string()),
        "{resources:?}"
    );
    for (payload, authorization) in received.raw.lock().unwrap().iter() {
        assert_eq!(authorization.as_deref(), Some("Bearer collector-token"));
        let text = String::from_utf8_lossy(payload);
        assert!(!text.contains(PROMPT_SECRET), "a prompt reached the collector");
    }
    assert_eq!(received.undecodable.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn prometheus_stores_the_exemplar_of_a_slow_request() {
    let Some(binary) = prometheus::binary() else {
        return; // only outside CI, which installs it (.ci/run)
    };
    // A slow first token: 1.2 s, past every TTFT bucket below it.
    let mut script = paced_capture();
    script.pieces[0].0 = Duration::from_millis(1200);
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    let dir = std::env::temp_dir().join(format!("llmslo-exemplars-{}", std::process::id()));
    let server = prometheus::start_with_flags(
        &binary,
        &dir,
        sidecar.metrics_addr,
        "groups: []\n",
        "",
        &["--enable-feature=exemplar-storage"],
    );
    assert_eq!(chat(sidecar.proxy_addr, Some(TRACE_IDS[2])).await, 200);
    settle(&sidecar).await;

    let query: String = form_urlencoded::byte_serialize(b"gen_ai_server_time_to_first_token_seconds_bucket").collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut found = None;
    while std::time::Instant::now() < deadline && found.is_none() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = server
            .api(&format!("/api/v1/query_exemplars?query={query}&start=0&end=9999999999"))
            .await;
        found = answer["data"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
            .find(|e| e["labels"]["trace_id"] == TRACE_IDS[2]);
    }
    let exemplar = found.expect("Prometheus never returned the slow request's exemplar");
    let value: f64 = exemplar["value"].as_str().unwrap().parse().unwrap();
    assert!(
        (1.2..2.0).contains(&value),
        "the exemplar carries the slow TTFT: {value}"
    );
    assert_eq!(exemplar["labels"]["span_id"], CLIENT_SPAN);
    let _ = std::fs::remove_dir_all(&dir);
}
