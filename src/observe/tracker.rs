//! The per-request tracker: follows one measured request from its head to its end and
//! records it exactly once, also when the client goes away (drop).

use super::decode::{Decoder, Encoding};
use super::event::EventSummary;
use super::prefetch::prefetch;
use super::recorder::{Recorder, RequestHandles};
use super::stream::{Counting, StreamObserver};
use super::strip::UsageStripper;
use super::tokens::TokenCounter;
use super::{messages, openai, responses, tgi};
use crate::otel::spans::RequestSpan;
use crate::record::{
    CountSource, Engine, EngineContext, EngineMoment, LabelText, LegPhase, Ongoing, Operation, Outcome, PrefillTimer,
    Protocol, RelaySkip, RequestRecord, RequestTargets, Served, TenantSource, TpotBasis, TraceRef, TtftParts,
    UnmeasuredReason,
};
use bytes::Bytes;
use http::{header, HeaderMap, StatusCode};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, warn};

/// How the response (or the attempt to get one) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The body reached its end.
    Complete,
    /// The upstream body failed part-way (reset, truncated chunking).
    BodyError,
    /// The client went away before the end.
    Cancelled,
    /// No response came from the engine; the sidecar answered with this outcome.
    Failed(Outcome),
    /// The sidecar refused it for its own limits: not a request of the SLOs, counted only in
    /// `llmslo_requests_refused_total`.
    Refused,
}

/// Measures one request; records it when finished, or as `client_cancelled` when dropped.
#[derive(Debug)]
pub struct RequestTracker {
    recorder: Arc<Recorder>,
    handles: RequestHandles,
    t0: Instant,
    max_event_bytes: usize,
    strip_usage: bool,
    tokenizer: Option<Arc<TokenCounter>>,
    response: ResponseKind,
    finished: bool,
    /// The engine as its `/metrics` showed it when the request arrived (when read).
    engine_at_arrival: Option<EngineMoment>,
    /// The trace its observations point to.
    trace: Trace,
    /// Its tenant and where it was read from, when tenants are configured.
    tenant: Option<(LabelText, Option<TenantSource>)>,
    /// The latency targets it states itself.
    targets: RequestTargets,
    /// The leg of a disaggregated request it is, if it is one (then it is no user request).
    leg: Option<LegPhase>,
    /// How it was served, for a user request.
    served: Option<Served>,
    /// Its prefill leg's claim on the relay, when its leg is relayed.
    relay: Option<Box<dyn PrefillTimer>>,
    /// Why the relay did not take its leg, when it did not.
    relay_skipped: Option<RelaySkip>,
    /// The leg its fields claimed where no such leg is expected.
    leg_fields_ignored: Option<LegPhase>,
}

/// The trace a request's observations point to (its exemplars).
#[derive(Debug, Default)]
enum Trace {
    /// None: not sampled, or no trace context at all.
    #[default]
    None,
    /// llmslo's own span, ended with the request's record.
    Span(Box<RequestSpan>),
    /// The client's sampled trace, when llmslo starts no span.
    Client(TraceRef),
}

#[derive(Debug)]
enum ResponseKind {
    /// No response head yet.
    Waiting,
    /// The status decided the outcome (4xx, 5xx).
    Decided(Outcome),
    /// A 2xx event stream (decoded when compressed), with the stripper when llmslo asked for
    /// usage on the client's behalf.
    Stream(Box<Decoder<StreamSink>>, Option<UsageStripper>),
    /// A 2xx JSON body (decoded when compressed), kept up to the event bound to read its usage.
    Json(Box<Decoder<JsonSink>>),
    /// Any other 2xx body.
    Opaque,
    /// A 2xx body llmslo could not read: its outcome comes from how it ended alone.
    Unmeasured(UnmeasuredReason),
}

/// Decoded stream bytes go to the observer, stamped with the time their frame arrived.
#[derive(Debug)]
struct StreamSink {
    observer: StreamObserver,
    now: Instant,
    gaps: Option<Arc<dyn Ongoing>>,
}

impl Write for StreamSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let gaps = &self.gaps;
        self.observer.feed(bytes, self.now, |gap| {
            if let Some(gaps) = gaps {
                gaps.gap(gap.as_secs_f64());
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Decoded JSON bytes are kept up to a bound; past it they are dropped and the body is unread.
#[derive(Debug)]
struct JsonSink {
    body: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl Write for JsonSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if !self.overflowed {
            if self.body.len() + bytes.len() > self.limit {
                self.overflowed = true;
                self.body = Vec::new();
            } else {
                self.body.extend_from_slice(bytes);
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl RequestTracker {
    /// Starts tracking a request whose head arrived at `t0`.
    pub fn start(
        recorder: Arc<Recorder>,
        raw_model: Option<&str>,
        operation: Operation,
        t0: Instant,
        max_event_bytes: usize,
    ) -> Self {
        let handles = recorder.start(raw_model, operation, t0);
        Self::with_handles(recorder, handles, t0, max_event_bytes, None)
    }

    /// Starts tracking a leg of a disaggregated request (`phase`): timed as a request is, but
    /// counted in the legs' own families, never as a user request.
    pub fn start_leg(
        recorder: Arc<Recorder>,
        raw_model: Option<&str>,
        operation: Operation,
        phase: LegPhase,
        t0: Instant,
        max_event_bytes: usize,
    ) -> Self {
        let handles = recorder.start_leg(raw_model, operation, t0);
        Self::with_handles(recorder, handles, t0, max_event_bytes, Some(phase))
    }

    fn with_handles(
        recorder: Arc<Recorder>,
        handles: RequestHandles,
        t0: Instant,
        max_event_bytes: usize,
        leg: Option<LegPhase>,
    ) -> Self {
        Self {
            engine_at_arrival: recorder.engine_moment(),
            recorder,
            handles,
            t0,
            max_event_bytes,
            strip_usage: false,
            tokenizer: None,
            response: ResponseKind::Waiting,
            finished: false,
            trace: Trace::None,
            tenant: None,
            targets: RequestTargets::default(),
            leg,
            served: None,
            relay: None,
            relay_skipped: None,
            leg_fields_ignored: None,
        }
    }

    /// Notes the leg a user request's fields claimed where no such leg is expected.
    pub fn leg_fields_ignored(&mut self, claimed: Option<LegPhase>) {
        self.leg_fields_ignored = claimed;
    }

    /// Notes how the request was served, and its prefill leg's relay ticket when relayed (or
    /// why the relay left it).
    pub fn served(&mut self, served: Served, relay: Result<Option<Box<dyn PrefillTimer>>, RelaySkip>) {
        self.served = Some(served);
        (self.relay, self.relay_skipped) = match relay {
            Ok(ticket) => (ticket, None),
            Err(skip) => (None, Some(skip)),
        };
    }

    /// Labels the request with its tenant, and the targets it states (from its head and body).
    pub fn serving(&mut self, tenant: Option<(LabelText, Option<TenantSource>)>, targets: RequestTargets) {
        self.tenant = tenant;
        self.targets = targets;
    }

    /// Ends `span` with the request, and points the request's exemplars at it.
    pub fn trace_with(&mut self, span: RequestSpan) {
        self.trace = Trace::Span(Box::new(span));
    }

    /// Points the request's exemplars at the client's trace (when llmslo starts no span).
    pub fn link_client_trace(&mut self, trace: Option<TraceRef>) {
        self.trace = trace.map_or(Trace::None, Trace::Client);
    }

    /// The request's normalised model label (never the raw client string).
    pub fn model(&self) -> &str {
        &self.handles.model
    }

    /// The request's operation.
    pub fn operation(&self) -> Operation {
        self.handles.operation
    }

    /// llmslo added `stream_options.include_usage` to the request: the usage-only chunk it
    /// brings must not reach the client.
    pub fn strip_usage_chunk(&mut self) {
        self.strip_usage = true;
    }

    /// Counts output tokens the stream does not state with the model's tokenizer.
    pub fn count_with(&mut self, tokenizer: Arc<TokenCounter>) {
        self.tokenizer = Some(tokenizer);
    }

    /// Chooses how to read the body from the response head.
    pub fn on_response_head(&mut self, status: StatusCode, headers: &HeaderMap) {
        if status.is_success() {
            self.recorder.confirm_model(&mut self.handles);
        }
        self.response = if let Some(outcome) = Outcome::from_status(status.as_u16()) {
            ResponseKind::Decided(outcome)
        } else {
            self.reader_for(headers)
        };
    }

    /// Whether the body it reads is rewritten on its way (the usage chunk llmslo asked for
    /// removed): its framing (`Content-Length`) must then be the forwarded bytes', not the engine's.
    pub fn rewrites_body(&self) -> bool {
        matches!(self.response, ResponseKind::Stream(_, Some(_)))
    }

    fn reader_for(&self, headers: &HeaderMap) -> ResponseKind {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let stream = content_type.starts_with("text/event-stream");
        if !stream && !content_type.starts_with("application/json") {
            return ResponseKind::Opaque;
        }
        let encoding = match Encoding::from_headers(headers) {
            Ok(encoding) => encoding,
            Err(coding) => {
                warn_once(
                    &UNDECODABLE_WARNED,
                    "a response's Content-Encoding cannot be decoded: such responses are forwarded \
                     untouched and counted in llmslo_unmeasured_responses_total, not measured (warned once)",
                    &coding,
                );
                return ResponseKind::Unmeasured(UnmeasuredReason::ContentEncoding);
            }
        };
        let decoder = if stream {
            let engine = self.recorder.engine();
            let sink = StreamSink {
                observer: StreamObserver::new(
                    self.handles.operation.protocol(),
                    self.max_event_bytes,
                    self.strip_usage,
                )
                .with_counting(Counting {
                    empty_finish_is_no_token: engine == Some(Engine::Llamacpp),
                    tokenizer: self.tokenizer.clone(),
                    mark_is_first_token: engine == Some(Engine::Vllm),
                }),
                now: self.t0,
                gaps: self.handles.ongoing.clone(),
            };
            Decoder::new(encoding, sink).map(|decoder| {
                // Usage can only be cut from bytes as they are; compressed, the client gets it too.
                let strip = self.strip_usage && decoder.is_identity();
                if self.strip_usage && !strip {
                    warn_once(
                        &UNSTRIPPED_WARNED,
                        "the usage chunk llmslo asked for cannot be removed from a compressed stream: \
                         such clients receive it (warned once); turn inject_usage off to avoid it",
                        "",
                    );
                }
                ResponseKind::Stream(Box::new(decoder), strip.then(UsageStripper::default))
            })
        } else {
            let sink = JsonSink {
                body: Vec::new(),
                limit: self.max_event_bytes,
                overflowed: false,
            };
            Decoder::new(encoding, sink).map(|decoder| ResponseKind::Json(Box::new(decoder)))
        };
        decoder.unwrap_or(ResponseKind::Unmeasured(UnmeasuredReason::DecodeError))
    }

    /// Asks for the stream state the next frame's measurement reads, so that it arrives while
    /// the frame itself is read from the engine.
    pub fn prefetch_stream_state(&self) {
        if let ResponseKind::Stream(decoder, _) = &self.response {
            prefetch(&**decoder);
        }
    }

    /// Observes a body frame received at `now`. Returns `None` to forward it as it is, or
    /// the bytes to forward instead (possibly none yet) when the usage chunk is being cut.
    pub fn on_data(&mut self, frame: &Bytes, now: Instant) -> Option<Bytes> {
        let decoded = match &mut self.response {
            ResponseKind::Stream(decoder, stripper) => {
                decoder.sink().observer.prefetch();
                decoder.sink_mut().now = now;
                let had_first_token = decoder.sink().observer.first_token_event().is_some();
                let decoded = decoder.write(frame);
                // The load is told once, and looked at only then: per chunk, the tracker reads
                // no more of its own state than the observer it feeds.
                if !had_first_token && decoder.sink().observer.first_token_event().is_some() {
                    if let Some(load) = self.handles.load.as_mut() {
                        load.first_token(now);
                    }
                }
                if let (Ok(()), Some(stripper)) = (&decoded, stripper.as_mut()) {
                    let observer = &mut decoder.sink_mut().observer;
                    return Some(stripper.push(frame, observer.boundary(), &observer.take_removable()));
                }
                decoded
            }
            ResponseKind::Json(decoder) => decoder.write(frame),
            _ => Ok(()),
        };
        if decoded.is_err() {
            self.response = ResponseKind::Unmeasured(UnmeasuredReason::DecodeError);
        }
        None
    }

    /// Bytes still held back when the body ends (an unfinished last event), if any.
    pub fn take_held(&mut self) -> Option<Bytes> {
        match &mut self.response {
            ResponseKind::Stream(_, Some(stripper)) => Some(stripper.finish()).filter(|b| !b.is_empty()),
            _ => None,
        }
    }

    /// Records the request; later calls (and the drop) do nothing.
    pub fn finish(&mut self, end: End, now: Instant) {
        if std::mem::replace(&mut self.finished, true) || end == End::Refused {
            return;
        }
        let mut record = RequestRecord::new(self.handles.model.clone(), self.handles.operation, now - self.t0);
        record.load = self.handles.load.as_ref().map(|load| load.load(now));
        record.engine_context = self
            .engine_at_arrival
            .zip(self.recorder.engine_moment())
            .map(|(arrival, end)| EngineContext::between(arrival, end));
        record.provider = self.recorder.engine();
        if let Some((tenant, source)) = self.tenant.take() {
            record.tenant = Some(tenant);
            record.tenant_source = source;
        }
        record.targets = self.targets;
        record.trace = match &self.trace {
            Trace::None => None,
            Trace::Span(span) => span.trace(),
            Trace::Client(trace) => Some(*trace),
        };
        let mut first_event = None;
        // The stream's own end signal was forwarded: the client has the whole answer, even if
        // it closes before the body's last bytes (the openai SDK stops reading at `[DONE]`).
        let mut answered = false;
        let body_outcome = match &self.response {
            ResponseKind::Waiting | ResponseKind::Opaque => None,
            ResponseKind::Decided(outcome) => Some(*outcome),
            ResponseKind::Unmeasured(reason) => {
                record.unmeasured = Some(*reason);
                None
            }
            ResponseKind::Stream(decoder, _) => {
                let summary = decoder.sink().observer.summary();
                first_event = summary.first_token_event.map(|first| first - self.t0);
                answered = summary.saw_done;
                if summary.gave_up {
                    // An engine that sends them sends them all the time: warned once.
                    warn_once(
                        &OVERSIZED_WARNED,
                        "a stream event exceeded max_event_bytes; measurement of such responses stops there \
                         (warned once)",
                        &self.max_event_bytes.to_string(),
                    );
                    record.unmeasured = Some(UnmeasuredReason::OversizedEvent);
                }
                summary.apply_to(&mut record, self.t0)
            }
            ResponseKind::Json(decoder) => {
                let sink = decoder.sink();
                let summary = match (sink.overflowed, self.handles.operation.protocol()) {
                    (true, _) => EventSummary::default(),
                    (false, Protocol::OpenAi) => openai::summarise(&sink.body),
                    (false, Protocol::Responses) => responses::summarise_body(&sink.body),
                    (false, Protocol::Messages) => messages::summarise_body(&sink.body),
                    (false, Protocol::Tgi) => tgi::summarise(&sink.body),
                };
                let usage = summary.usage.unwrap_or_default();
                record.output_tokens = usage.output_tokens;
                record.input_tokens = usage.input_tokens;
                record.reasoning_tokens = usage.reasoning_tokens;
                record.engine = summary.engine;
                summary.error.map(Outcome::of_fault)
            }
        };
        record.outcome = match (end, &self.response) {
            (End::Failed(outcome), _) => outcome,
            (_, ResponseKind::Decided(outcome)) => *outcome,
            (End::Cancelled, _) if !answered && self.recorder.limits().cutting_at_shutdown() => Outcome::Shutdown,
            (End::Cancelled, _) if !answered => Outcome::ClientCancelled,
            (End::Cancelled, _) => body_outcome.unwrap_or(Outcome::Success),
            (End::BodyError, _) => Outcome::UpstreamError,
            (End::Complete, _) => body_outcome.unwrap_or(Outcome::Success),
            (End::Refused, _) => unreachable!("a refused request is never recorded"),
        };
        // The engine's word is input: only what fits llmslo's own clock is kept.
        record.engine = record
            .engine
            .map(|timing| timing.consistent_with(record.ttft, record.e2e));
        debug!(
            model = %record.model,
            operation = record.operation.as_str(),
            outcome = record.outcome.as_str(),
            streamed = record.count_source.is_some(),
            ttft_ms = record.ttft.map(|d| d.as_secs_f64() * 1e3),
            answer_ttft_ms = record.answer_ttft.map(|d| d.as_secs_f64() * 1e3),
            first_token_event_ms = first_event.map(|d| d.as_secs_f64() * 1e3),
            tpot_ms = record.tpot().map(|d| d.as_secs_f64() * 1e3),
            tpot_basis = record.tpot_basis.map(TpotBasis::as_str),
            e2e_ms = record.e2e.as_secs_f64() * 1e3,
            output_tokens = record.output_tokens,
            input_tokens = record.input_tokens,
            token_count_source = record.count_source.map(CountSource::as_str),
            load_arrival = record.load.map(|l| l.arrival),
            load_decode = record.load.and_then(|l| l.decode),
            engine_queue_ms = record.engine.and_then(|e| e.queue).map(|s| s * 1e3),
            engine_prefill_ms = record.engine.and_then(|e| e.prefill).map(|s| s * 1e3),
            engine_tpot_ms = record.engine.and_then(|e| e.tpot).map(|s| s * 1e3),
            engine_waiting_at_arrival = record.engine_context.and_then(|c| c.waiting_at_arrival),
            "request finished"
        );
        if let Some(phase) = self.leg {
            self.recorder.finish_leg(&record, phase);
            return;
        }
        record.served = self.served;
        record.relay_skipped = self.relay_skipped;
        record.leg_fields_ignored = self.leg_fields_ignored;
        if self.served == Some(Served::Disaggregated) {
            let prefill = self.relay.take().and_then(|ticket| ticket.prefill());
            record.ttft_parts = record.ttft.map(|ttft| TtftParts::split(ttft, prefill, record.engine));
        }
        if let Trace::Span(span) = std::mem::take(&mut self.trace) {
            span.finish(&record);
        }
        self.recorder.finish(&record);
    }
}

static UNDECODABLE_WARNED: AtomicBool = AtomicBool::new(false);
static UNSTRIPPED_WARNED: AtomicBool = AtomicBool::new(false);
static OVERSIZED_WARNED: AtomicBool = AtomicBool::new(false);

/// Logs `message` at warn level the first time, at debug level after that.
fn warn_once(flag: &AtomicBool, message: &'static str, detail: &str) {
    if flag.swap(true, Ordering::Relaxed) {
        debug!(detail, "{message}");
    } else {
        warn!(detail, "{message}");
    }
}

impl Drop for RequestTracker {
    fn drop(&mut self) {
        self.finish(End::Cancelled, Instant::now());
    }
}
