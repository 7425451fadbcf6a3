//! Watching responses go by and producing each request's record: SSE parsing, one interpreter
//! per wire protocol (OpenAI chat and completions, Responses, Messages, TGI), the observed body,
//! and the recorder that labels requests and hands their records to the readers.
//!
//! Dependencies run one way: `event` is at the bottom; the interpreters read events into
//! summaries; `stream` folds summaries into a stream's facts; `tracker` turns those into a
//! request's record and gives it to the `recorder`; `body` follows a response through the
//! proxy.

pub mod body;
pub mod decode;
pub mod event;
pub mod messages;
pub mod models;
pub mod openai;
pub mod prefetch;
pub mod recorder;
pub mod repeat;
pub mod responses;
pub mod sse;
pub mod steps;
pub mod stream;
pub mod strip;
pub mod tenants;
pub mod tgi;
pub mod tokens;
pub mod tracker;
