//! Watching responses go by: SSE parsing, protocol interpretation, the observed body and
//! the per-request record.

pub mod body;
pub mod decode;
pub mod openai;
pub mod record;
pub mod repeat;
pub mod sse;
pub mod stream;
pub mod strip;
pub mod tgi;
pub mod tokens;
pub mod tracker;
