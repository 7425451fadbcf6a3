//! One streamed request as a user's client sees it, measured with the sidecar's own stream
//! observer, from the moment the request is sent.

use super::prompts::Prompt;
use crate::observe::stream::StreamObserver;
use crate::record::Operation;
use crate::record::{Outcome, RequestRecord};
use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Largest stream event the observer reads.
const MAX_EVENT_BYTES: usize = 1 << 20;
/// How much of an error answer is kept to show the user.
const ERROR_SNIPPET_BYTES: usize = 200;

/// Which route the sweep calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` with one user message (or the dataset's messages).
    Chat,
    /// `POST /v1/completions` with a plain prompt.
    Completions,
    /// `POST /v1/responses` (OpenAI's Responses API) with the messages as its input.
    Responses,
    /// `POST /v1/messages` (Anthropic's Messages API) with the messages.
    Messages,
}

impl Endpoint {
    /// Every endpoint, in the order [`Endpoint::index`] gives.
    const ALL: [Endpoint; 4] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Messages,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The endpoint a trace's `api` names (`chat`, `completions`, `responses`, `messages`).
    pub fn from_api(api: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.api() == api)
    }

    /// The `api` a trace names it by.
    pub fn api(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
        }
    }

    /// The route whose requests are `operation`'s, when the sweep has one.
    pub fn of_operation(operation: Operation) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.operation() == operation)
    }

    fn operation(self) -> Operation {
        match self {
            Endpoint::Chat => Operation::Chat,
            Endpoint::Completions => Operation::TextCompletion,
            Endpoint::Responses => Operation::Responses,
            Endpoint::Messages => Operation::Messages,
        }
    }
}

/// One request the sweep will send: its route, prompt and output length.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The route.
    pub endpoint: Endpoint,
    /// What it says.
    pub prompt: Prompt,
    /// Output tokens it asks for.
    pub output_tokens: u32,
}

/// What the sweep asks of every request.
#[derive(Debug, Clone)]
pub struct RequestShape {
    /// The target's base URL, without `/v1`.
    pub base: String,
    /// The route of requests that name none.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// `Authorization: Bearer` token, when the target needs one.
    pub api_key: Option<String>,
    /// Ask the engine to generate exactly `max_tokens` (vLLM and SGLang's `ignore_eos`).
    pub ignore_eos: bool,
    /// Longest a request may take before it counts as a timeout.
    pub timeout: Duration,
    /// PEM certificates trusted for an `https://` target besides the public roots.
    pub ca_cert: Option<PathBuf>,
}

/// One measured request.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent.
    pub sent: Instant,
    /// What was measured, with the sidecar's definitions (model and operation are the sweep's).
    pub record: RequestRecord,
    /// Gaps between its token events (inter-chunk latency).
    pub gaps: Vec<Duration>,
    /// From sending to the first body bytes of a streamed answer (time to first byte).
    pub ttfb: Option<Duration>,
    /// For a failure: what the target said or what went wrong, bounded.
    pub failure: Option<String>,
    /// The output tokens it asked for.
    pub asked_output_tokens: u32,
}

/// A pooled HTTP client that sends the sweep's requests.
#[derive(Debug, Clone)]
pub struct Requester {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    shape: RequestShape,
    /// Each endpoint's URI, by [`Endpoint::index`].
    uris: Vec<Uri>,
}

impl Requester {
    /// A client for `shape` (`http://`, or `https://` verified against the public roots and
    /// `ca_cert`).
    pub fn new(shape: RequestShape) -> Result<Self, String> {
        let uris = Endpoint::ALL
            .iter()
            .map(|endpoint| format!("{}{}", shape.base, endpoint.path()).parse::<Uri>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--target {}: not a URL ({e})", shape.base))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        connector.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(shape.ca_cert.as_ref())?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Self { client, shape, uris })
    }

    /// The target's base URL.
    pub fn base(&self) -> &str {
        &self.shape.base
    }

    /// The model every request asks for.
    pub fn model(&self) -> &str {
        &self.shape.model
    }

    /// A request of the default endpoint: `prompt`, asking for `output_tokens`.
    pub fn plan(&self, prompt: Prompt, output_tokens: u32) -> Planned {
        Planned {
            endpoint: self.shape.endpoint,
            prompt,
            output_tokens,
        }
    }

    /// The request body of `planned`.
    pub fn body(&self, planned: &Planned) -> Bytes {
        let (prompt, output_tokens) = (&planned.prompt, planned.output_tokens);
        let mut body = serde_json::json!({"model": self.shape.model, "stream": true});
        match planned.endpoint {
            Endpoint::Chat | Endpoint::Completions => {
                body["max_tokens"] = output_tokens.into();
                body["stream_options"] = serde_json::json!({"include_usage": true});
            }
            // The typed APIs always report usage in their last events.
            Endpoint::Responses => body["max_output_tokens"] = output_tokens.into(),
            Endpoint::Messages => body["max_tokens"] = output_tokens.into(),
        }
        match planned.endpoint {
            Endpoint::Chat | Endpoint::Messages => body["messages"] = prompt.messages(),
            Endpoint::Completions => body["prompt"] = prompt.text().into(),
            Endpoint::Responses => body["input"] = prompt.messages(),
        }
        if self.shape.ignore_eos {
            body["ignore_eos"] = true.into();
        }
        Bytes::from(body.to_string())
    }

    /// Sends `planned` and measures it to its end (or its timeout).
    pub async fn send(&self, planned: &Planned) -> Sample {
        let body = self.body(planned);
        let endpoint = planned.endpoint;
        let sent = Instant::now();
        let mut sample = Sample {
            sent,
            record: RequestRecord::new(self.shape.model.as_str().into(), endpoint.operation(), Duration::ZERO),
            gaps: Vec::new(),
            ttfb: None,
            failure: None,
            asked_output_tokens: planned.output_tokens,
        };
        let exchange = self.exchange(endpoint, body, sent, &mut sample);
        let outcome = match tokio::time::timeout(self.shape.timeout, exchange).await {
            Ok(Ok(())) => Outcome::Success,
            Ok(Err((outcome, message))) => {
                sample.failure = Some(message);
                outcome
            }
            Err(_) => {
                sample.failure = Some(format!(
                    "no complete answer within {:?} (--request-timeout)",
                    self.shape.timeout
                ));
                Outcome::Timeout
            }
        };
        sample.record.outcome = outcome;
        sample.record.e2e = sent.elapsed();
        sample
    }

    async fn exchange(
        &self,
        endpoint: Endpoint,
        body: Bytes,
        sent: Instant,
        sample: &mut Sample,
    ) -> Result<(), (Outcome, String)> {
        let uri = &self.uris[endpoint.index()];
        let mut request = Request::post(uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "text/event-stream")
            .header(header::ACCEPT_ENCODING, "identity");
        if let Some(key) = &self.shape.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                (
                    Outcome::ClientError,
                    "the API key holds characters a header cannot".to_string(),
                )
            })?;
            request = request.header(header::AUTHORIZATION, value.clone());
            if endpoint == Endpoint::Messages {
                request = request.header("x-api-key", value);
            }
        }
        if endpoint == Endpoint::Messages {
            request = request.header("anthropic-version", "2023-06-01");
        }
        let request = request.body(Full::new(body)).expect("a valid request");
        let response = self.client.request(request).await.map_err(|e| {
            let cause = crate::upstream::innermost_cause(&e);
            (Outcome::ConnectError, format!("cannot reach {uri}: {cause}"))
        })?;
        let status = response.status();
        if !status.is_success() {
            let outcome = Outcome::from_status(status.as_u16()).unwrap_or(Outcome::UpstreamError);
            let body = Limited::new(response.into_body(), 64 << 10).collect().await;
            let text = body.map(|b| b.to_bytes()).unwrap_or_default();
            return Err((outcome, answer_message(status, &text)));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string();
        if !content_type.to_ascii_lowercase().starts_with("text/event-stream") {
            return Err((
                Outcome::UpstreamError,
                format!("answered {status} with Content-Type {content_type}, not an event stream: the endpoint does not stream"),
            ));
        }
        let protocol = endpoint.operation().protocol();
        let mut observer = StreamObserver::new(protocol, MAX_EVENT_BYTES, false);
        let mut body = response.into_body();
        let gaps = &mut sample.gaps;
        let mut broken = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        let now = Instant::now();
                        sample.ttfb.get_or_insert(now - sent);
                        observer.feed(data, now, |gap| gaps.push(gap));
                    }
                }
                Err(e) => {
                    broken = Some(format!("the stream broke: {}", crate::upstream::innermost_cause(&e)));
                    break;
                }
            }
        }
        let failed = observer.summary().apply_to(&mut sample.record, sent);
        match (broken, failed) {
            (Some(message), _) => Err((Outcome::UpstreamError, message)),
            (None, Some(outcome)) => Err((
                outcome,
                "the stream carried an error or ended before its last event".to_string(),
            )),
            (None, None) => Ok(()),
        }
    }

    /// GETs `/v1/models` and returns the first model's id, if the target lists one.
    pub async fn first_model(&self) -> Result<Option<String>, String> {
        let uri = format!("{}/v1/models", self.shape.base);
        let mut request = Request::get(&uri);
        if let Some(key) = &self.shape.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("{uri}: {e}"))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("cannot reach {uri}: {}", crate::upstream::innermost_cause(&e)))?;
        if response.status() != StatusCode::OK {
            return Ok(None);
        }
        let body = Limited::new(response.into_body(), 1 << 20).collect().await;
        let body = body.map(|b| b.to_bytes()).unwrap_or_default();
        let listed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Ok(listed["data"][0]["id"].as_str().map(str::to_string))
    }
}

/// Largest page [`fetch_text`] reads: a trace's bound.
pub const MAX_FETCHED_BYTES: usize = crate::workload::trace::MAX_TRACE_BYTES as usize;

/// GETs `url` and returns its body as text (a sidecar's `/workload`), within a minute.
pub async fn fetch_text(url: &str, ca_cert: Option<&PathBuf>) -> Result<String, String> {
    let uri: Uri = url.parse().map_err(|e| format!("not a URL ({e})"))?;
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(ca_cert)?)
        .https_or_http()
        .enable_http1()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let fetch = async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("cannot reach it: {}", crate::upstream::innermost_cause(&e)))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_FETCHED_BYTES)
            .collect()
            .await
            .map_err(|e| format!("the answer broke off or is over {MAX_FETCHED_BYTES} bytes: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(answer_message(status, &body));
        }
        String::from_utf8(body.to_vec()).map_err(|_| "the answer is not UTF-8 text".to_string())
    };
    tokio::time::timeout(Duration::from_secs(60), fetch)
        .await
        .map_err(|_| "no answer within a minute".to_string())?
}

/// TLS for `https://` targets: the public web roots, plus the certificates of `ca_cert`.
fn tls_config(ca_cert: Option<&PathBuf>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_cert {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("--ca-cert {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("--ca-cert {}: no certificate in the file", path.display()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("--ca-cert {}: {e}", path.display()))?;
        }
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// `status: message`, the message taken from an OpenAI error body when there is one, bounded.
fn answer_message(status: StatusCode, body: &[u8]) -> String {
    let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let message = parsed["error"]["message"]
        .as_str()
        .or_else(|| parsed["message"].as_str())
        .or_else(|| parsed["error"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    let mut message: String = message.chars().filter(|c| !c.is_control()).collect();
    if message.len() > ERROR_SNIPPET_BYTES {
        let mut cut = ERROR_SNIPPET_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    if message.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_are_short_and_readable() {
        let openai = br#"{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError"}}"#;
        assert_eq!(
            answer_message(StatusCode::NOT_FOUND, openai),
            "404 Not Found: The model `x` does not exist."
        );
        assert_eq!(answer_message(StatusCode::BAD_GATEWAY, b""), "502 Bad Gateway");
        let long = "x".repeat(1000);
        let message = answer_message(StatusCode::INTERNAL_SERVER_ERROR, long.as_bytes());
        assert!(message.len() < 260 && message.ends_with('…'), "{message}");
        assert_eq!(
            answer_message(StatusCode::BAD_REQUEST, b"bad\r\ninput\x1b"),
            "400 Bad Request: badinput"
        );
    }

    #[test]
    fn bodies_ask_for_a_stream_with_usage() {
        let shape = RequestShape {
            base: "http://127.0.0.1:1".into(),
            endpoint: Endpoint::Completions,
            model: "m".into(),
            api_key: None,
            ignore_eos: true,
            timeout: Duration::from_secs(1),
            ca_cert: None,
        };
        let requester = Requester::new(shape.clone()).unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&requester.body(&requester.plan(Prompt::Text("hi".into()), 7))).unwrap();
        assert_eq!(body["prompt"], "hi");
        assert_eq!(body["max_tokens"], 7);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["ignore_eos"], true);
        let chat = Requester::new(RequestShape {
            endpoint: Endpoint::Chat,
            ignore_eos: false,
            ..shape
        })
        .unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&chat.body(&chat.plan(Prompt::Text("hi".into()), 7))).unwrap();
        assert_eq!(body["messages"][0]["content"], "hi");
        assert!(body.get("ignore_eos").is_none());
    }
}
