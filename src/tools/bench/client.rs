//! The benchmark's clients: streams chat completions back to back and stamps, as a client on
//! the same host sees them, the first token and the gaps between the frames that follow.

use crate::quantile::nearest_rank;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What the clients of one measurement saw.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Requests that finished.
    pub requests: u64,
    /// Requests that failed (not a 200, or the stream broke).
    pub failed: u64,
    /// The failures by what they were: `no answer`, `status 502`, `broken stream`.
    pub failures: std::collections::BTreeMap<String, u64>,
    /// Output tokens of the requests that finished.
    pub output_tokens: u64,
    /// Output tokens streamed during the warm-up (the proxy's CPU time covers them too).
    pub warmup_output_tokens: u64,
    /// Seconds from sending to the first token, sorted.
    ttft: Vec<f64>,
    /// Seconds between body frames after the first token, sorted.
    gaps: Vec<f64>,
}

impl Samples {
    /// 99th percentile TTFT, seconds (NaN without samples).
    pub fn ttft_p99(&self) -> f64 {
        nearest_rank(&self.ttft, 0.99)
    }

    /// 99th percentile gap between frames, seconds (NaN without samples).
    pub fn gap_p99(&self) -> f64 {
        nearest_rank(&self.gaps, 0.99)
    }

    /// Counts one failed request, by what it was.
    fn fail(&mut self, what: String) {
        self.failed += 1;
        *self.failures.entry(what).or_default() += 1;
    }

    fn merge(&mut self, other: Samples) {
        self.requests += other.requests;
        self.failed += other.failed;
        for (what, count) in other.failures {
            *self.failures.entry(what).or_default() += count;
        }
        self.output_tokens += other.output_tokens;
        self.warmup_output_tokens += other.warmup_output_tokens;
        self.ttft.extend(other.ttft);
        self.gaps.extend(other.gaps);
    }
}

/// `streams` clients against `target` (over TLS trusting `roots`, when given), each asking for
/// `tokens` per request (naming `prefill` as the prefill pod, as llm-d's scheduler does, when
/// given): `warmup` to open connections and
/// fill pools unrecorded, then `duration` recorded (requests sent after the warm-up).
pub async fn run_streams(
    target: SocketAddr,
    prefill: Option<SocketAddr>,
    roots: Option<&rustls::RootCertStore>,
    streams: usize,
    warmup: Duration,
    duration: Duration,
    tokens: u32,
) -> Samples {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("the default protocol versions")
            .with_root_certificates(roots.cloned().unwrap_or_else(rustls::RootCertStore::empty))
            .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let scheme = if roots.is_some() { "https" } else { "http" };
    let body = Bytes::from(
        serde_json::json!({
            "model": "sim",
            "messages": [{"role": "user", "content": "How fast is this?"}],
            "max_tokens": tokens,
            "stream": true,
        })
        .to_string(),
    );
    let record_from = Instant::now() + warmup;
    let deadline = record_from + duration;
    let mut tasks = JoinSet::new();
    for _ in 0..streams {
        let (client, body) = (client.clone(), body.clone());
        tasks.spawn(async move {
            let mut samples = Samples::default();
            let mut unrecorded = Samples::default();
            while Instant::now() < deadline {
                let into = if Instant::now() < record_from {
                    &mut unrecorded
                } else {
                    &mut samples
                };
                stream_once(&client, scheme, target, prefill, body.clone(), tokens, into).await;
            }
            samples.warmup_output_tokens = unrecorded.output_tokens;
            samples
        });
    }
    let mut all = Samples::default();
    while let Some(done) = tasks.join_next().await {
        all.merge(done.expect("a client task panicked"));
    }
    all.ttft.sort_by(f64::total_cmp);
    all.gaps.sort_by(f64::total_cmp);
    all
}

async fn stream_once(
    client: &Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    scheme: &str,
    target: SocketAddr,
    prefill: Option<SocketAddr>,
    body: Bytes,
    tokens: u32,
    samples: &mut Samples,
) {
    let mut request = http::Request::post(format!("{scheme}://{target}/v1/chat/completions"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("a valid request");
    if let Some(prefill) = prefill {
        request.headers_mut().insert(
            "x-prefiller-host-port",
            http::HeaderValue::from_str(&prefill.to_string()).expect("an address is a header value"),
        );
    }
    let sent = Instant::now();
    let Ok(response) = client.request(request).await else {
        samples.fail("no answer".into());
        return;
    };
    if response.status() != http::StatusCode::OK {
        samples.fail(format!("status {}", response.status().as_u16()));
        return;
    }
    let mut body = response.into_body();
    let mut last_frame: Option<Instant> = None;
    let (mut ttft, mut gaps) = (None, Vec::new());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            samples.fail("broken stream".into());
            return;
        };
        let Some(data) = frame.data_ref() else { continue };
        let now = Instant::now();
        match last_frame {
            Some(previous) => gaps.push(now.duration_since(previous).as_secs_f64()),
            None if carries_token(data) => ttft = Some(now.duration_since(sent).as_secs_f64()),
            None => continue,
        }
        last_frame = Some(now);
    }
    samples.requests += 1;
    samples.output_tokens += u64::from(tokens);
    samples.ttft.extend(ttft);
    samples.gaps.extend(gaps);
}

/// Whether a frame holds a non-empty `content` delta (vLLM's first chunk carries only the role).
fn carries_token(data: &[u8]) -> bool {
    let needle = b"\"content\":\"";
    data.windows(needle.len() + 1)
        .any(|w| w.starts_with(needle) && w[needle.len()] != b'"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_only_chunk_carries_no_token() {
        assert!(!carries_token(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(carries_token(br#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#));
        assert!(!carries_token(b"data: [DONE]"));
    }
}
