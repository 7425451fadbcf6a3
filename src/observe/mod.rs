//! Watching responses go by: which routes are measured, SSE parsing, one interpreter per wire
//! protocol (OpenAI chat and completions, Responses, Messages, TGI), the observed body and the
//! per-request record.
//!
//! Dependencies run one way: `route` and `event` are at the bottom; the interpreters read
//! events into summaries; `stream` folds summaries into a stream's facts; `record` turns
//! those into a request's record; `tracker` and `body` follow a request through the proxy.

pub mod body;
pub mod decode;
pub mod event;
pub mod messages;
pub mod openai;
pub mod repeat;
pub mod responses;
pub mod sse;
pub mod steps;
pub mod stream;
pub mod strip;
pub mod tgi;
pub mod tokens;
pub mod tracker;
