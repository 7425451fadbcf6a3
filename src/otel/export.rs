//! The OTLP exporters: a tracer provider for the request spans and a meter provider for the
//! metrics, each built only when its signal is switched on, each exporting from its own
//! background thread so the request path only hands it finished records.

use super::settings::{OtelSettings, OtlpProtocol, SamplerChoice, SignalExport};
use super::spans::RequestSpans;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, PeriodicReader, SdkMeterProvider, Stream};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::{info, warn};

/// The name llmslo's tracer and meter carry (the instrumentation scope).
const SCOPE: &str = "llmslo";

/// The running OTLP export, if any signal is on.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Builds the exporters `settings` switch on; must run inside the tokio runtime (gRPC
    /// export spawns its connection there).
    pub fn start(settings: &OtelSettings) -> Result<Self, String> {
        let resource = resource(settings);
        let tracer = match &settings.traces {
            Some(export) => {
                let exporter = span_exporter(export).map_err(|e| format!("OTLP trace exporter: {e}"))?;
                let mut builder = SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource.clone());
                if let Some(choice) = settings.sampler {
                    builder = builder.with_sampler(sampler(choice));
                }
                info!(protocol = ?export.protocol, "exporting a span per generation request over OTLP");
                Some(builder.build())
            }
            None => None,
        };
        let meter = match &settings.metrics {
            Some(export) => {
                let exporter = metric_exporter(export).map_err(|e| format!("OTLP metric exporter: {e}"))?;
                let mut reader = PeriodicReader::builder(exporter);
                if let Some(interval) = settings.metric_interval {
                    reader = reader.with_interval(interval);
                }
                info!(protocol = ?export.protocol, "exporting metrics over OTLP");
                let mut provider = SdkMeterProvider::builder()
                    .with_reader(reader.build())
                    .with_resource(resource);
                if settings.exponential_histograms {
                    provider = provider.with_view(exponential_histograms);
                }
                Some(provider.build())
            }
            None => None,
        };
        Ok(Self { tracer, meter })
    }

    /// The span starter, when traces are exported.
    pub fn spans(&self) -> Option<RequestSpans> {
        self.tracer
            .as_ref()
            .map(|provider| RequestSpans::new(provider.tracer(SCOPE)))
    }

    /// The meter, when metrics are exported.
    pub fn meter(&self) -> Option<Meter> {
        self.meter.as_ref().map(|provider| provider.meter(SCOPE))
    }

    /// Exports what is pending and stops the exporters (off the runtime's threads: it blocks).
    pub async fn shutdown(self) {
        let Telemetry { tracer, meter } = self;
        if tracer.is_none() && meter.is_none() {
            return;
        }
        let stopped = tokio::task::spawn_blocking(move || {
            if let Some(Err(error)) = tracer.map(|t| t.shutdown()) {
                warn!(%error, "OTLP span export did not shut down cleanly");
            }
            if let Some(Err(error)) = meter.map(|m| m.shutdown()) {
                warn!(%error, "OTLP metric export did not shut down cleanly");
            }
        });
        let _ = stopped.await;
    }
}

fn resource(settings: &OtelSettings) -> Resource {
    let mut builder = Resource::builder();
    if let Some(name) = &settings.service_name {
        builder = builder.with_service_name(name.clone());
    }
    builder
        .with_attributes(
            settings
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

fn sampler(choice: SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::Ratio(r) => Sampler::TraceIdRatioBased(r),
        SamplerChoice::ParentBasedOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        SamplerChoice::ParentBasedOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        SamplerChoice::ParentBasedRatio(r) => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))),
    }
}

/// Builds one signal's exporter for its protocol, with the file's endpoint and headers.
macro_rules! exporter {
    ($builder:expr, $export:expr) => {{
        let export: &SignalExport = $export;
        match export.protocol {
            OtlpProtocol::Grpc => {
                let mut builder = $builder.with_tonic();
                if let Some(endpoint) = &export.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                if !export.headers.is_empty() {
                    let mut metadata = tonic::metadata::MetadataMap::new();
                    for (key, value) in &export.headers {
                        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes())
                            .map_err(|_| format!("header name `{key}` cannot be sent over gRPC"))?;
                        let value = value
                            .parse()
                            .map_err(|_| format!("the value of header `{key}` cannot be sent over gRPC"))?;
                        metadata.insert(key, value);
                    }
                    builder = builder.with_metadata(metadata);
                }
                builder.build().map_err(|e| e.to_string())
            }
            OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => {
                let protocol = match export.protocol {
                    OtlpProtocol::HttpJson => Protocol::HttpJson,
                    _ => Protocol::HttpBinary,
                };
                let mut builder = $builder.with_http().with_protocol(protocol);
                if let Some(endpoint) = &export.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                if !export.headers.is_empty() {
                    builder = builder.with_headers(export.headers.clone().into_iter().collect());
                }
                builder.build().map_err(|e| e.to_string())
            }
        }
    }};
}

fn span_exporter(export: &SignalExport) -> Result<SpanExporter, String> {
    exporter!(SpanExporter::builder(), export)
}

fn metric_exporter(export: &SignalExport) -> Result<MetricExporter, String> {
    exporter!(MetricExporter::builder(), export)
}

/// Every histogram as a base-2 exponential histogram with the specification's defaults (160
/// buckets, starting at the finest scale and coarsening as the values spread), which
/// Prometheus's OTLP receiver stores as a native histogram.
fn exponential_histograms(instrument: &Instrument) -> Option<Stream> {
    (instrument.kind() == InstrumentKind::Histogram).then(|| {
        Stream::builder()
            .with_aggregation(Aggregation::Base2ExponentialHistogram {
                max_size: 160,
                max_scale: 20,
                record_min_max: true,
            })
            .build()
            .expect("a stream that only sets the aggregation is valid")
    })
}
