//! The running sidecar: the proxy port, the metrics port and the readiness probe, started
//! together and stopped together, over the readers its [`measurement`] composes.

pub mod measurement;
mod metrics_port;
mod reload;

use crate::config::{defaults, Config};
use crate::engine::scrape::{scrape_engine, ScrapeSettings};
use crate::engine::EngineMetricsMode;
use crate::gpu::nvml::NvmlSource;
use crate::gpu::simulated::SimulatedSource;
use crate::gpu::{run_sampler, DeviceSource, GpuState};
use crate::health::{self, Readiness};
use crate::metrics::Metrics;
use crate::observe::recorder::{Recorder, RecorderSettings};
use crate::observe::tenants::Tenants;
use crate::observe::tokens::TokenCounter;
use crate::otel::export::Telemetry;
use crate::proxy::observe::ObserveSettings;
use crate::proxy::relay::pool::PrefillPool;
use crate::proxy::relay::PrefillRelay;
use crate::proxy::{Proxy, ProxySettings};
use crate::record::Reader;
use crate::serve::tls::ServerTls;
use crate::serve::{serve_on, ConnectionLimits, KeepAlive};
use crate::upstream::UpstreamClient;
use measurement::{Measurement, MeasurementSettings};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Connections open at once on the metrics port (scrapers and probes need a handful).
const METRICS_MAX_CONNECTIONS: usize = 256;
/// Longest a scrape may wait for its reader: a client that never reads frees its slot.
const METRICS_SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// A metrics-port connection with no scrape for this long is closed: longer than a 60 s scrape
/// interval, so a scraper keeps its connection.
const METRICS_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Concurrent streams one HTTP/2 connection may open on the metrics port.
const METRICS_MAX_STREAMS: u32 = 8;

/// A started sidecar; dropping it does not stop it, [`Sidecar::shutdown`] does.
#[derive(Debug)]
pub struct Sidecar {
    /// Where the proxy accepts client requests.
    pub proxy_addr: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_addr: SocketAddr,
    /// What `/metrics` encodes (tests read it directly).
    pub metrics: Arc<Metrics>,
    /// Where every request is recorded: the engine and models it has learned.
    pub recorder: Arc<Recorder>,
    /// Stops the proxy, which then drains.
    stop_proxy: CancellationToken,
    proxy_task: tokio::task::JoinHandle<()>,
    /// Stops the metrics port and the background tasks, once the proxy has drained.
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
    telemetry: Telemetry,
    /// How long `/metrics` waits for a scrape of the final counts after the drain.
    final_scrape_grace: Duration,
}

impl Sidecar {
    /// Binds both ports and starts serving.
    pub async fn start(config: &Config) -> std::io::Result<Self> {
        Self::start_with(config, Vec::new()).await
    }

    /// [`Sidecar::start`], with `readers` reading every request beside llmslo's own.
    pub async fn start_with(config: &Config, readers: Vec<Arc<dyn Reader>>) -> std::io::Result<Self> {
        let proxy_listener = bind(config.listen, "the proxy", "--listen").await?;
        let relay_listener = match config.prefill_relay {
            Some(address) => Some(bind(address, "the prefill relay", "--prefill-relay").await?),
            None => None,
        };
        let metrics_listener = bind(config.metrics_listen, "/metrics", "--metrics-listen").await?;
        warn_if_over_the_memory_limit(config);
        let tls = match &config.tls {
            Some(source) => Some(ServerTls::load(source.clone(), None).map_err(std::io::Error::other)?),
            None => None,
        };
        let proxy_addr = proxy_listener.local_addr()?;
        let metrics_addr = metrics_listener.local_addr()?;

        let otel = config
            .otel_settings()
            .map_err(|e| std::io::Error::other(format!("{}: {}", e.key, e.reason)))?;
        let telemetry = Telemetry::start(&otel).map_err(std::io::Error::other)?;
        let gpu = config.gpu.enabled.then(|| GpuState::new(config.gpu.interval));
        let measurement = Measurement::new(MeasurementSettings {
            recorder: RecorderSettings {
                engine: config.engine.fixed(),
                models: config.models.clone(),
                max_models: config.max_models,
                per_request_slos: config.per_request_slos,
            },
            buckets: config.buckets.clone(),
            slos: config.slos.clone(),
            tenants: config.tenants.clone(),
            cost: config.cost.clone(),
            capacity_window: config.capacity_window,
            engine_metrics: config.engine_metrics,
            otlp: telemetry.meter(),
            gpu: gpu.clone(),
            recent_requests: config.recent_requests,
            role: config.role,
            routers_send_decode_legs: !config.decode_leg_sources.is_empty(),
            tls: tls.clone(),
            extra: readers,
        });
        let metrics = measurement.metrics.clone();
        let recorder = measurement.recorder.clone();
        if let Some(error) = &config.file_error {
            error!(
                %error,
                "the config file is invalid: forwarding without it (flags, environment and defaults; no SLOs) \
                 until it is fixed; llmslo_config_valid is 0"
            );
            metrics.config_status().loaded(false);
        }
        for (i, error) in Tenants::key_table_errors(&config.tenants) {
            error!(
                %error,
                source = i,
                "an API-key table of tenants.from could not be read: its keys label no one (the next source does) \
                 until the file can be read; llmslo_tenant_api_keys_valid is 0"
            );
        }
        let client = UpstreamClient::with_tls(
            &config.upstream,
            &config.upstream_tls,
            config.max_in_flight_requests,
            config.upstream_idle_timeout,
        )
        .map_err(std::io::Error::other)?;
        let tokenizer = match &config.tokenizer {
            Some(path) => {
                let counter = TokenCounter::load(path)
                    .map_err(|e| std::io::Error::other(format!("config key `tokenizer`: {e}")))?;
                info!(path = %counter.path().display(), "counting tokens of streams that state none with this tokenizer");
                Some(Arc::new(counter))
            }
            None => None,
        };
        let pool = PrefillPool::new(config.prefill_pool.clone());
        let relay = match &relay_listener {
            Some(listener) => Some(
                PrefillRelay::new(
                    listener.local_addr()?,
                    config.upstream_timeout,
                    pool.clone(),
                    config.prefill_tls.as_ref(),
                )
                .map_err(std::io::Error::other)?,
            ),
            None => None,
        };
        // The window is a backstop for a stalled probe; failures turn readiness off sooner.
        let readiness = Arc::new(Readiness::new(config.health_interval * 3 + Duration::from_secs(2)));
        let proxy = Arc::new(Proxy::new(
            client.clone(),
            recorder.clone(),
            ProxySettings {
                upstream: config.upstream.to_string(),
                max_body_bytes: config.max_body_bytes,
                request_body_timeout: config.request_body_timeout,
                request_body_total_timeout: config.request_body_total_timeout,
                request_body_min_rate: config.request_body_min_rate,
                max_in_flight_requests: config.max_in_flight_requests,
                max_in_flight_per_client: config.max_in_flight_per_client,
                upstream_timeout: config.upstream_timeout,
                stream_idle_timeout: config.stream_idle_timeout,
                observe: ObserveSettings {
                    max_peek_bytes: config.max_peek_bytes,
                    max_buffered_request_bytes: config.max_buffered_request_bytes,
                    max_event_bytes: config.max_event_bytes,
                    inject_usage: config.inject_usage,
                    tokenizer,
                    spans: telemetry.spans(),
                    relay: relay.clone().map(|r| r as Arc<dyn crate::record::PrefillDiverter>),
                    decode_leg_sources: config.decode_leg_sources.clone(),
                },
            },
        ));

        // The proxy stops first and drains; the metrics port and the background tasks stop
        // after it, so the drained streams' final counts can still be scraped.
        let stop_proxy = CancellationToken::new();
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some(tls) = &tls {
            tasks.spawn(tls.clone().keep_current(shutdown.clone()));
        }
        let proxy_task = tokio::spawn(serve_on(
            proxy_listener,
            tls.clone(),
            move |request, peer| proxy.handle(request, peer),
            stop_proxy.clone(),
            config.drain_timeout,
            ConnectionLimits {
                max_connections: config.max_connections,
                counters: Some(recorder.limits().clone()),
                send_timeout: Some(config.send_timeout),
                idle_timeout: Some(config.connection_idle_timeout),
                keep_alive: Some(KeepAlive {
                    interval: config.http2_keep_alive_interval,
                    timeout: config.http2_keep_alive_timeout,
                }),
                max_streams_per_connection: config.max_streams_per_connection,
                live_when_full: false,
            },
        ));
        if let (Some(listener), Some(relay)) = (relay_listener, relay) {
            info!(
                address = %listener.local_addr()?,
                pool = %config.prefill_pool.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                "relaying and timing the prefill legs of the requests forwarded, to the pods of the pool alone"
            );
            tasks.spawn(pool.keep_resolved(shutdown.clone()));
            // With prefill_tls the routing sidecar sends its legs here in TLS, as it would
            // to a prefill pod: the proxy's certificate, else one made now.
            let relay_tls = match (&config.prefill_tls, &tls) {
                (None, _) => None,
                (Some(_), Some(tls)) => Some(tls.clone()),
                (Some(_), None) => Some(
                    ServerTls::load(crate::serve::tls::TlsSource::SelfSigned, None).map_err(std::io::Error::other)?,
                ),
            };
            // Stopped with the metrics port, once the proxy has drained: its streams' legs
            // are relayed to the end.
            tasks.spawn(serve_on(
                listener,
                relay_tls,
                move |request, _peer| {
                    let relay = relay.clone();
                    async move { Ok::<_, std::convert::Infallible>(relay.relay(request).await) }
                },
                shutdown.clone(),
                config.drain_timeout,
                // A leg for each request in flight, each on a connection of its own at most.
                ConnectionLimits {
                    send_timeout: Some(config.send_timeout),
                    idle_timeout: Some(config.connection_idle_timeout),
                    ..ConnectionLimits::new(config.max_in_flight_requests)
                },
            ));
        }
        let port = metrics_port::MetricsPort {
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            workload: measurement.recent.clone(),
        };
        tasks.spawn(serve_on(
            metrics_listener,
            tls.filter(|_| config.metrics_tls),
            move |request, _peer| metrics_port::handle(request, port.clone()),
            shutdown.clone(),
            config.drain_timeout,
            ConnectionLimits {
                send_timeout: Some(METRICS_SEND_TIMEOUT),
                idle_timeout: Some(METRICS_IDLE_TIMEOUT),
                keep_alive: Some(KeepAlive {
                    interval: config.http2_keep_alive_interval,
                    timeout: config.http2_keep_alive_timeout,
                }),
                max_streams_per_connection: METRICS_MAX_STREAMS,
                live_when_full: true,
                ..ConnectionLimits::new(METRICS_MAX_CONNECTIONS)
            },
        ));
        if config.engine_metrics != EngineMetricsMode::Off {
            tasks.spawn(scrape_engine(
                client.clone(),
                measurement.engine_view.clone(),
                ScrapeSettings {
                    path: config.engine_metrics_path.clone(),
                    interval: config.engine_metrics_interval,
                    timeout: defaults::ENGINE_METRICS_TIMEOUT,
                    max_bytes: defaults::ENGINE_METRICS_MAX_BYTES,
                    max_samples: config.engine_metrics_max_samples,
                },
                shutdown.clone(),
            ));
        }
        tasks.spawn(health::probe_upstream(
            client,
            health::Probe {
                path: config.health_path.clone(),
                interval: config.health_interval,
                readiness,
                recorder: recorder.clone(),
            },
            shutdown.clone(),
        ));
        if let Some(state) = gpu {
            let source: Option<Box<dyn DeviceSource>> = if config.gpu.simulated {
                info!("gpu.simulated: exporting one simulated GPU, not reading NVML");
                Some(Box::new(SimulatedSource::new()))
            } else {
                match NvmlSource::open(&config.gpu.library_path) {
                    Ok(source) => Some(Box::new(source)),
                    Err(error) => {
                        warn!(
                            %error,
                            library = %config.gpu.library_path,
                            "NVML is not available: no GPU series (llmslo_gpu_up 0); everything else works"
                        );
                        None
                    }
                }
            };
            if let Some(source) = source {
                tasks.spawn(run_sampler(source, config.gpu.processes, state, shutdown.clone()));
            }
        }
        if let Some(every) = measurement.forget_tenants_every() {
            tasks.spawn(forget_idle_tenants(measurement.clone(), every, shutdown.clone()));
        }
        if config.file.is_some() {
            tasks.spawn(reload::reload_on_change(config.clone(), measurement, shutdown.clone()));
        }
        let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
        info!(%proxy_addr, %metrics_addr, upstream = %config.upstream, worker_threads, "llmslo sidecar started");
        Ok(Self {
            proxy_addr,
            metrics_addr,
            metrics,
            recorder,
            stop_proxy,
            proxy_task,
            shutdown,
            tasks,
            telemetry,
            final_scrape_grace: config.final_scrape_grace,
        })
    }

    /// Stops accepting, lets in-flight responses finish (up to the drain deadline) while
    /// `/metrics` still answers, keeps `/metrics` up for one more scrape of the final counts
    /// (up to `final_scrape_grace`, where anyone scrapes it), then stops the rest and returns.
    pub async fn shutdown(mut self) {
        info!("stopping: new connections are refused, in-flight responses finish (drain_timeout)");
        self.stop_proxy.cancel();
        let _ = (&mut self.proxy_task).await;
        self.await_final_scrape().await;
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.telemetry.shutdown().await;
        info!("llmslo sidecar stopped");
    }
}

impl Sidecar {
    /// Waits for a scrape that begins after the drain, so the last streams' outcomes are read;
    /// not at all where nothing has ever scraped `/metrics`.
    async fn await_final_scrape(&self) {
        let mut scrapes = self.metrics.scrapes();
        let before = *scrapes.borrow_and_update();
        if before == 0 || self.final_scrape_grace.is_zero() {
            return;
        }
        info!(
            grace_secs = self.final_scrape_grace.as_secs_f64(),
            "drained: /metrics stays up for one more scrape of the final counts (final_scrape_grace)"
        );
        let scraped = tokio::time::timeout(self.final_scrape_grace, scrapes.wait_for(|n| *n > before)).await;
        if scraped.is_err() {
            warn!("no scrape came within final_scrape_grace: the last streams' counts may not have been read");
        }
    }
}

/// Warns when the config's worst case does not fit the container's memory limit: reaching
/// its limits at once would have the container killed instead of requests refused.
/// Looks for idle learned tenants every `every` until shutdown, giving their slots back.
async fn forget_idle_tenants(measurement: Measurement, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => measurement.forget_idle_tenants(),
        }
    }
}

fn warn_if_over_the_memory_limit(config: &Config) {
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    let worst = config.worst_case_memory_bytes(worker_threads);
    if let Some(limit) = crate::config::memory::container_limit_bytes().filter(|limit| worst > *limit) {
        warn!(
            worst_case_mib = worst >> 20,
            container_limit_mib = limit >> 20,
            "with these limits the sidecar can need more memory than its container may use: lower \
             max_connections, max_in_flight_requests or max_buffered_request_bytes, or raise the limit"
        );
    }
}

/// Binds `addr`; the error says which address it was for and the flag that changes it.
async fn bind(addr: SocketAddr, what: &str, flag: &str) -> std::io::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(e) => {
            let holder = if e.kind() == std::io::ErrorKind::AddrInUse && serves_llmslo_metrics(addr).await {
                "; an llmslo serves /metrics there: one still stopping keeps it up for its final_scrape_grace \
                 (wait for it, or stop it again to exit at once)"
            } else {
                ""
            };
            Err(std::io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} for {what} ({e}){holder}; choose another address with {flag}"),
            ))
        }
    }
}

/// Whether what listens on `addr` answers `/metrics` with llmslo's own series (asked on the
/// loopback for an address of every interface); a second at most.
async fn serves_llmslo_metrics(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(target).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: llmslo\r\n\r\n")
            .await
            .ok()?;
        let mut page = Vec::new();
        stream.take(1 << 20).read_to_end(&mut page).await.ok()?;
        Some(page.windows(17).any(|w| w == b"llmslo_build_info"))
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Stops `sidecar` (its drain, then its final scrape's grace), unless a second termination
/// signal comes first: then it returns at once, saying what it skipped. Whether it stopped
/// in full.
pub async fn stop_unless_interrupted_again(sidecar: Sidecar) -> bool {
    let again = termination_signal();
    tokio::select! {
        () = sidecar.shutdown() => true,
        () = again => {
            eprintln!(
                "llmslo: stopped again: exiting now, without waiting for the streams in flight or the final scrape"
            );
            false
        }
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called,
/// not when it is first awaited, so a signal that comes while the caller starts up is caught.
pub fn termination_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    #[cfg(unix)]
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        #[cfg(unix)]
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
