//! vLLM-shaped response bodies: stream chunks and whole responses for chat and completions.

use crate::observe::record::Operation;
use serde_json::{json, Value};

/// Identity shared by every chunk of one response.
#[derive(Debug, Clone)]
pub struct ResponseId {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Chat or completions.
    pub operation: Operation,
}

impl ResponseId {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.operation, streaming) {
            (Operation::Chat, true) => "chat.completion.chunk",
            (Operation::Chat, false) => "chat.completion",
            (Operation::TextCompletion, _) => "text_completion",
        }
    }

    fn envelope(&self, streaming: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(streaming),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The first chat chunk: role only, empty content (not a token).
    pub fn role_chunk(&self) -> Value {
        self.envelope(
            true,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
        )
    }

    /// A chunk carrying `text` (one or more tokens); `finish` is set on the last one.
    pub fn content_chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.operation {
            Operation::Chat => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish})
            }
            Operation::TextCompletion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }

    /// The usage-only chunk sent when `stream_options.include_usage` is set.
    pub fn usage_chunk(&self, prompt_tokens: u64, completion_tokens: u64) -> Value {
        let mut chunk = self.envelope(true, json!([]));
        chunk["usage"] = usage(prompt_tokens, completion_tokens);
        chunk
    }

    /// A whole non-streaming response.
    pub fn full_response(&self, text: &str, prompt_tokens: u64, completion_tokens: u64) -> Value {
        let choice = match self.operation {
            Operation::Chat => json!({
                "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "length"
            }),
            Operation::TextCompletion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
            }
        };
        let mut response = self.envelope(false, json!([choice]));
        response["usage"] = usage(prompt_tokens, completion_tokens);
        response
    }
}

fn usage(prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    })
}

/// A vLLM-style error object (`{"error": {...}}`), as sent in a body or a stream event.
pub fn error_body(message: &str, kind: &str, code: u16) -> Value {
    json!({"error": {"object": "error", "message": message, "type": kind, "param": null, "code": code}})
}

/// One SSE event carrying `value` as its data.
pub fn sse_event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// The stream's final sentinel event.
pub const DONE_EVENT: &str = "data: [DONE]\n\n";
