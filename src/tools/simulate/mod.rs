//! The built-in simulated engine: an OpenAI-compatible server shaped like vLLM, TGI (with
//! its native generate API) or llama.cpp, serving chat, completions, embeddings and the
//! Responses and Messages APIs, with configurable TTFT and TPOT, several tokens per chunk,
//! `n > 1`, reasoning before the answer and injected faults. It is what the tests run
//! against and what `llmslo demo` serves.

pub mod batching;
pub mod delay;
pub mod disagg;
pub mod exposition;
mod pace;
mod request;
mod respond;
pub mod routing;
pub mod shape;
pub mod typed;

use crate::metrics::limits::GaugeGuard;
use crate::record::Operation;
use batching::{Batcher, BatchingOptions, Occupancy};
use bytes::Bytes;
use delay::Delay;
use disagg::{KvRequest, PdOptions};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use pace::{EngineClock, Pacer};
use prometheus_client::metrics::gauge::Gauge;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use request::read_request;
pub use request::PromptCounting;
pub use respond::SimAbort;
use respond::{bad_request, json_response, not_found, ChannelBody, SimBody};
use shape::{error_body, Flavor, Shape};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WORDS: [&str; 16] = [
    "the",
    "model",
    "streams",
    "tokens",
    "while",
    "the",
    "sidecar",
    "measures",
    "latency",
    "per",
    "request",
    "and",
    "exports",
    "every",
    "figure",
    "faithfully",
];

/// How the simulated engine behaves.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The engine imitated.
    pub flavor: Flavor,
    /// Output tokens sent as reasoning before the answer (chat's `reasoning_content`, a
    /// Responses reasoning item, a Messages thinking block).
    pub reasoning_tokens: u32,
    /// Model names served; requests naming another get 404 like vLLM.
    pub models: Vec<String>,
    /// Time from request to the first content chunk.
    pub ttft: Delay,
    /// Time per output token after the first.
    pub tpot: Delay,
    /// Tokens carried by each content chunk (speculative decoding, `--stream-interval`).
    pub tokens_per_chunk: u32,
    /// Output tokens when the request sets no `max_tokens`.
    pub default_max_tokens: u32,
    /// Probability of answering HTTP 500.
    pub error_rate: f64,
    /// Probability of an error payload mid-stream (after a 200).
    pub midstream_error_rate: f64,
    /// Probability of closing the connection abruptly mid-stream.
    pub abort_rate: f64,
    /// Seed for token text, timing draws and fault decisions.
    pub seed: u64,
    /// Continuous batching instead of the fixed delays: every request shares one loop of
    /// decode steps, so latency depends on load (`ttft` and `tpot` are then unused).
    pub batching: Option<BatchingOptions>,
    /// State each request's own timing beside its usage, as vLLM does with
    /// `--enable-per-request-metrics` (queue, scheduling to first token, mean inter-token
    /// latency).
    pub per_request_metrics: bool,
    /// One half of a disaggregated pair (prefill or decode engine), outside batching mode.
    pub pd: Option<PdOptions>,
    /// How prompts are counted for the usage.
    pub prompt_counting: PromptCounting,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            flavor: Flavor::Vllm,
            reasoning_tokens: 0,
            models: vec!["sim".to_string()],
            ttft: Delay::Fixed(Duration::from_millis(200)),
            tpot: Delay::Fixed(Duration::from_millis(30)),
            tokens_per_chunk: 1,
            default_max_tokens: 64,
            error_rate: 0.0,
            midstream_error_rate: 0.0,
            abort_rate: 0.0,
            seed: 0,
            batching: None,
            per_request_metrics: false,
            pd: None,
            prompt_counting: PromptCounting::default(),
        }
    }
}

/// The simulated engine's shared state.
#[derive(Debug)]
pub struct SimEngine {
    options: SimOptions,
    requests: AtomicU64,
    /// The engine loop, in batching mode, started with the server.
    batcher: OnceLock<Batcher>,
    /// Streams being generated (outside batching mode, where the loop counts them).
    streaming: Gauge,
    /// Prompt tokens of every generation request so far.
    prompt_tokens: AtomicU64,
}

/// What goes wrong in one response, decided when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Http500,
    MidstreamError,
    Abort,
}

impl SimEngine {
    /// An engine with `options`.
    pub fn new(options: SimOptions) -> Arc<Self> {
        Arc::new(Self {
            options,
            requests: AtomicU64::new(0),
            batcher: OnceLock::new(),
            streaming: Gauge::default(),
            prompt_tokens: AtomicU64::new(0),
        })
    }

    /// Serves on `listener` until `shutdown`.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        self.serve_on(listener, None, shutdown).await
    }

    /// [`SimEngine::serve`], in TLS when `tls` is given (an https engine).
    pub async fn serve_on(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<Arc<crate::serve::tls::ServerTls>>,
        shutdown: CancellationToken,
    ) {
        if let Some(batching) = self.options.batching {
            let batcher = Batcher::start(
                batching,
                self.options.tokens_per_chunk,
                self.options.seed,
                shutdown.clone(),
            );
            let _ = self.batcher.set(batcher);
        }
        crate::serve::serve_on(
            listener,
            tls,
            move |request, _peer| self.clone().handle(request),
            shutdown,
            Duration::from_secs(5),
            crate::serve::ConnectionLimits::new(crate::config::defaults::MAX_CONNECTIONS),
        )
        .await
    }

    /// Answers one request.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Result<Response<SimBody>, Infallible> {
        let path = request.uri().path().to_string();
        let tgi = self.options.flavor == Flavor::Tgi;
        let mut response = match (request.method().clone(), path.as_str()) {
            (Method::GET, "/health") => json_response(StatusCode::OK, String::new()),
            (Method::GET, "/metrics") => self.metrics_page(),
            (Method::GET, "/v1/models") => self.models(),
            (Method::GET, "/info") if tgi => self.info(),
            (Method::POST, "/generate_stream" | "/generate") if !tgi => not_found(),
            (Method::POST, _) => match Operation::from_path(&path) {
                Some(Operation::Embeddings) => self.embed(request).await,
                Some(operation) if operation.is_generation() => {
                    self.generate(request, operation, path == "/generate_stream").await
                }
                _ => not_found(),
            },
            _ => not_found(),
        };
        if tgi {
            response
                .headers_mut()
                .insert("x-compute-type", http::HeaderValue::from_static("gpu+optimized"));
        }
        Ok(response)
    }

    /// The engine's `/metrics` page in its own format: queue, batch, KV cache.
    fn metrics_page(&self) -> Response<SimBody> {
        let occupancy = match self.batcher.get() {
            Some(batcher) => batcher.occupancy(),
            None => Occupancy {
                running: usize::try_from(self.streaming.get()).unwrap_or(0),
                ..Occupancy::default()
            },
        };
        let prompt_tokens = self.prompt_tokens.load(Ordering::Relaxed);
        let page = exposition::page(self.options.flavor, &self.options.models[0], occupancy, prompt_tokens);
        Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(
                Full::new(Bytes::from(page))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("static response parts are valid")
    }

    fn info(&self) -> Response<SimBody> {
        let info = serde_json::json!({"model_id": self.options.models[0], "router": "text-generation-router"});
        json_response(StatusCode::OK, info.to_string())
    }

    fn models(&self) -> Response<SimBody> {
        let data: Vec<_> = self
            .options
            .models
            .iter()
            .map(|m| {
                let owned_by = self.options.flavor.owned_by(m);
                serde_json::json!({"id": m, "object": "model", "created": unix_now(), "owned_by": owned_by})
            })
            .collect();
        json_response(
            StatusCode::OK,
            serde_json::json!({"object": "list", "data": data}).to_string(),
        )
    }

    async fn generate(
        &self,
        request: Request<Incoming>,
        operation: Operation,
        native_stream: bool,
    ) -> Response<SimBody> {
        let parsed = match read_request(request).await {
            Ok(parsed) => parsed,
            Err(answer) => return answer,
        };
        let model = match parsed.model.as_deref() {
            None => self.options.models[0].clone(),
            Some(m) if self.options.models.iter().any(|served| served == m) => m.to_string(),
            Some(m) => {
                let message = format!("The model `{m}` does not exist.");
                let body = match operation {
                    Operation::Messages => typed::messages::error_body("not_found_error", &message),
                    _ => error_body(&message, "NotFoundError", 404),
                };
                return json_response(StatusCode::NOT_FOUND, body.to_string());
            }
        };
        let max_tokens = parsed
            .max_tokens
            .or(parsed.max_completion_tokens)
            .or(parsed.max_output_tokens)
            .or(parsed.parameters.as_ref().and_then(|p| p.max_new_tokens))
            .unwrap_or(self.options.default_max_tokens);
        if max_tokens == 0 || max_tokens > 1_000_000 {
            return bad_request("max_tokens must be between 1 and 1000000");
        }
        let choices = parsed.n.unwrap_or(1);
        let single = matches!(
            operation,
            Operation::Generate | Operation::Responses | Operation::Messages
        );
        if !(1..=16).contains(&choices) || (choices > 1 && single) {
            return bad_request("n must be between 1 and 16 (and 1 for /generate, /v1/responses and /v1/messages)");
        }
        let kv = match self.options.pd {
            Some(_) => KvRequest::of(parsed.kv_transfer_params.as_ref()),
            None => KvRequest::None,
        };
        if kv == KvRequest::DecodeWithoutBlocks {
            let body = error_body(
                "KV transfer failed: kv_transfer_params name no prefilled KV blocks",
                "InternalServerError",
                500,
            );
            return json_response(StatusCode::INTERNAL_SERVER_ERROR, body.to_string());
        }
        let (serial, mut rng) = self.next_request();
        let fault = self.draw_fault(&mut rng);
        if fault == Fault::Http500 {
            let body = error_body("simulated engine failure", "InternalServerError", 500);
            return json_response(StatusCode::INTERNAL_SERVER_ERROR, body.to_string());
        }
        let prompt_tokens = self.options.prompt_counting.count(&parsed);
        let shape = Shape {
            flavor: self.options.flavor,
            id: format!(
                "{}-sim{serial:016x}",
                if operation == Operation::Chat {
                    "chatcmpl"
                } else {
                    "cmpl"
                }
            ),
            created: unix_now(),
            model,
            operation,
            prompt_tokens,
            reasons_first: self.options.reasoning_tokens > 0 && operation != Operation::TextCompletion,
        };
        self.prompt_tokens.fetch_add(prompt_tokens, Ordering::Relaxed);
        let plan = Plan {
            prompt_tokens,
            max_tokens,
            choices,
            include_usage: parsed.stream_options.is_some_and(|o| o.include_usage),
            fault,
            kv,
            serial,
        };
        let streaming = match operation {
            Operation::Generate => native_stream,
            _ => parsed.stream,
        };
        if streaming {
            self.stream(shape, plan, rng)
        } else {
            self.whole(shape, plan, rng).await
        }
    }

    /// The next request's serial number, and its random draws (from the seed and the serial).
    fn next_request(&self) -> (u64, SmallRng) {
        let serial = self.requests.fetch_add(1, Ordering::Relaxed);
        (
            serial,
            SmallRng::seed_from_u64(self.options.seed ^ serial.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )
    }

    fn draw_fault(&self, rng: &mut SmallRng) -> Fault {
        let o = &self.options;
        if rng.random_bool(o.error_rate.clamp(0.0, 1.0)) {
            Fault::Http500
        } else if rng.random_bool(o.midstream_error_rate.clamp(0.0, 1.0)) {
            Fault::MidstreamError
        } else if rng.random_bool(o.abort_rate.clamp(0.0, 1.0)) {
            Fault::Abort
        } else {
            Fault::None
        }
    }

    /// Streams the response: opening chunks at once, then one chunk per choice each time the
    /// pacer says tokens are ready (fixed delays, or the batching loop's steps).
    fn stream(&self, shape: Shape, plan: Plan, mut rng: SmallRng) -> Response<SimBody> {
        let (tx, rx) = mpsc::channel(16);
        let options = self.options.clone();
        let mut pacer = self.pacer(&plan, &mut rng);
        let mut clock = EngineClock::start();
        let streaming = GaugeGuard::new(self.streaming.clone());
        tokio::spawn(async move {
            let _streaming = streaming;
            let send = |event: String| tx.send(Ok(Frame::data(Bytes::from(event))));
            for event in shape.opening(plan.choices) {
                if send(event).await.is_err() {
                    return;
                }
            }
            let fault_at = plan.max_tokens / 2;
            let mut texts = vec![String::new(); plan.choices as usize];
            // The block being streamed (reasoning or not) and its text, for the typed APIs.
            let mut block: Option<(bool, String)> = None;
            let mut sent = 0;
            while sent < plan.max_tokens {
                let Some((n, scheduled)) = pacer.next(plan.max_tokens - sent, &mut rng).await else {
                    return; // the engine loop stopped
                };
                clock.step(scheduled);
                if plan.fault != Fault::None && sent >= fault_at.max(1) {
                    if plan.fault == Fault::MidstreamError {
                        let _ = send(shape.error()).await;
                        if let Some(done) = shape.done() {
                            let _ = send(done).await;
                        }
                    } else {
                        let _ = tx.send(Err(SimAbort)).await;
                    }
                    return;
                }
                let reasoning = shape.reasons_first && sent < options.reasoning_tokens;
                sent += n;
                for (choice, all) in texts.iter_mut().enumerate() {
                    let text = words(&mut rng, n);
                    let mut event = match &block {
                        Some((kind, _)) if *kind == reasoning => String::new(),
                        Some((kind, previous)) => {
                            shape.close_block(*kind, previous) + &shape.open_block(reasoning, false)
                        }
                        None => shape.open_block(reasoning, true),
                    };
                    if block.as_ref().is_none_or(|(kind, _)| *kind != reasoning) {
                        block = Some((reasoning, String::new()));
                    }
                    if let Some((_, block_text)) = block.as_mut() {
                        block_text.push_str(&text);
                    }
                    if !reasoning {
                        all.push_str(&text);
                    }
                    let finish = (sent == plan.max_tokens).then_some((all.as_str(), sent));
                    event += &shape.token(choice as u32, sent, &text, reasoning, finish);
                    if send(event).await.is_err() {
                        return; // the client went away
                    }
                }
            }
            let completion_tokens = u64::from(plan.max_tokens) * u64::from(plan.choices);
            let reasoning_tokens =
                u64::from(options.reasoning_tokens.min(plan.max_tokens)) * u64::from(shape.reasons_first);
            let (last_kind, last_text) = block.unwrap_or_default();
            let answer = texts.first().map_or("", String::as_str);
            let metrics = options
                .per_request_metrics
                .then(|| clock.metrics(plan.max_tokens, options.tokens_per_chunk));
            let closing = shape.closing(
                plan.include_usage,
                completion_tokens,
                reasoning_tokens,
                (last_kind, &last_text),
                answer,
                metrics.as_ref(),
            );
            for event in closing {
                if send(event).await.is_err() {
                    return;
                }
            }
        });
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .body(ChannelBody(rx).boxed_unsync())
            .expect("static response parts are valid")
    }

    /// What paces a response's tokens: the batching loop when it runs, else fixed delays
    /// counted from now.
    fn pacer(&self, plan: &Plan, rng: &mut SmallRng) -> Pacer {
        match self.batcher.get() {
            Some(batcher) => Pacer::Batch(batcher.submit(plan.prompt_tokens, plan.max_tokens, plan.choices)),
            None => Pacer::Delays {
                due: Instant::now() + self.first_token(plan, rng),
                tpot: self.options.tpot,
                per_chunk: self.options.tokens_per_chunk.max(1),
            },
        }
    }

    /// The time to a request's first token outside batching mode: the TTFT drawn, or what
    /// its part in a disaggregated pair takes.
    fn first_token(&self, plan: &Plan, rng: &mut SmallRng) -> Duration {
        let ttft = self.options.ttft.sample(rng);
        match self.options.pd {
            Some(pd) => pd.first_token(plan.kv, plan.prompt_tokens, ttft, self.options.tpot.sample(rng)),
            None => ttft,
        }
    }

    /// Answers `/v1/embeddings` after the time to first token: one small vector per input.
    async fn embed(&self, request: Request<Incoming>) -> Response<SimBody> {
        let parsed = match read_request(request).await {
            Ok(parsed) => parsed,
            Err(answer) => return answer,
        };
        let (_, mut rng) = self.next_request();
        if self.draw_fault(&mut rng) != Fault::None {
            let body = error_body("simulated engine failure", "InternalServerError", 500);
            return json_response(StatusCode::INTERNAL_SERVER_ERROR, body.to_string());
        }
        tokio::time::sleep(self.options.ttft.sample(&mut rng)).await;
        let tokens = self.options.prompt_counting.count(&parsed);
        let answer = serde_json::json!({
            "object": "list",
            "model": parsed.model.unwrap_or_else(|| self.options.models[0].clone()),
            "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 0.125, 1.0]}],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        });
        json_response(StatusCode::OK, answer.to_string())
    }

    /// Waits as long as generating all tokens takes, then answers with one JSON body.
    async fn whole(&self, shape: Shape, plan: Plan, mut rng: SmallRng) -> Response<SimBody> {
        let mut pacer = self.pacer(&plan, &mut rng);
        let mut generated = 0;
        while generated < plan.max_tokens {
            match pacer.next(plan.max_tokens - generated, &mut rng).await {
                Some((n, _)) => generated += n,
                None => break,
            }
        }
        if plan.fault != Fault::None {
            let body = error_body("simulated engine failure", "InternalServerError", 500);
            return json_response(StatusCode::INTERNAL_SERVER_ERROR, body.to_string());
        }
        let texts: Vec<String> = (0..plan.choices).map(|_| words(&mut rng, plan.max_tokens)).collect();
        let completion_tokens = u64::from(plan.max_tokens) * u64::from(plan.choices);
        let mut body = shape.whole(&texts, plan.prompt_tokens, completion_tokens);
        if plan.kv == KvRequest::Prefill {
            body["kv_transfer_params"] = disagg::prefilled(plan.serial, plan.prompt_tokens);
        }
        json_response(StatusCode::OK, body.to_string())
    }
}

/// `n` random words, each with a leading space (one token each).
fn words(rng: &mut SmallRng, n: u32) -> String {
    (0..n)
        .map(|_| format!(" {}", WORDS[rng.random_range(0..WORDS.len())]))
        .collect()
}

/// What one generation will do.
#[derive(Debug, Clone, Copy)]
struct Plan {
    prompt_tokens: u64,
    max_tokens: u32,
    choices: u32,
    include_usage: bool,
    fault: Fault,
    /// What its `kv_transfer_params` ask (in a disaggregated pair).
    kv: KvRequest,
    serial: u64,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
