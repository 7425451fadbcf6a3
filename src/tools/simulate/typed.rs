//! The simulated engine's typed-event APIs, shaped as vLLM serves them: OpenAI's Responses
//! API (`event: response.*`, no `[DONE]`) and Anthropic's Messages API (`message_start` sent
//! with the first generated token, content blocks, `message_stop`). Reasoning comes first
//! in its own item or block.

use serde_json::{json, Value};

/// One typed SSE event: `event: <type>` and its data, which repeats the type.
/// Who answers: what every event of one response names.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    /// The response's id, without the API's prefix.
    pub id: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: &'a str,
}

fn event(kind: &str, mut data: Value) -> String {
    data["type"] = json!(kind);
    format!("event: {kind}\ndata: {data}\n\n")
}

/// The Responses API's events.
pub mod responses {
    use super::*;

    /// The response object in its state `status`, with `usage` once it is done.
    pub fn object(identity: &Identity<'_>, status: &str, output: Value, usage: Value) -> Value {
        let finished = status != "in_progress";
        json!({
            "id": format!("resp_{}", identity.id),
            "object": "response",
            "created_at": identity.created,
            "model": identity.model,
            "status": status,
            "incomplete_details": finished.then(|| json!({"reason": "max_output_tokens"})),
            "output": output,
            "usage": usage,
        })
    }

    /// `response.created` and `response.in_progress`, sent before prefill.
    pub fn opening(identity: &Identity<'_>) -> Vec<String> {
        ["response.created", "response.in_progress"]
            .into_iter()
            .map(|kind| {
                event(
                    kind,
                    json!({"response": object(identity, "in_progress", json!([]), Value::Null)}),
                )
            })
            .collect()
    }

    fn item(reasoning: bool, status: &str, text: &str) -> Value {
        if reasoning {
            json!({"id": "rs_sim", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status})
        } else {
            json!({"id": "msg_sim", "type": "message", "role": "assistant", "status": status,
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
    }

    /// The events that open an output item (reasoning or the message) at `index`.
    pub fn open(reasoning: bool, index: u32) -> String {
        let mut events = event(
            "response.output_item.added",
            json!({"output_index": index, "item": item(reasoning, "in_progress", "")}),
        );
        if !reasoning {
            events += &event(
                "response.content_part.added",
                json!({"item_id": "msg_sim", "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
        }
        events
    }

    /// One delta of generated text.
    pub fn delta(reasoning: bool, index: u32, text: &str) -> String {
        let (kind, item) = if reasoning {
            ("response.reasoning_text.delta", "rs_sim")
        } else {
            ("response.output_text.delta", "msg_sim")
        };
        event(
            kind,
            json!({"item_id": item, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
        )
    }

    /// The events that close an output item whose whole text is `text`.
    pub fn close(reasoning: bool, index: u32, text: &str) -> String {
        let (kind, item_id) = if reasoning {
            ("response.reasoning_text.done", "rs_sim")
        } else {
            ("response.output_text.done", "msg_sim")
        };
        let mut events = event(
            kind,
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
        );
        if !reasoning {
            events += &event(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": text, "annotations": []}}),
            );
        }
        events
            + &event(
                "response.output_item.done",
                json!({"output_index": index, "item": item(reasoning, "completed", text)}),
            )
    }

    /// The usage object.
    pub fn usage(prompt_tokens: u64, output_tokens: u64, reasoning_tokens: u64) -> Value {
        json!({
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens,
        })
    }

    /// `response.completed`, cut at the token limit as vLLM reports it (status `incomplete`).
    pub fn completed(identity: &Identity<'_>, text: &str, usage: Value, metrics: Option<&Value>) -> String {
        let output = json!([item(false, "completed", text)]);
        let mut response = object(identity, "incomplete", output, usage);
        if let Some(metrics) = metrics {
            response["metrics"] = metrics.clone();
        }
        event("response.completed", json!({"response": response}))
    }

    /// `response.failed`: the engine broke down mid-stream.
    pub fn failed(identity: &Identity<'_>) -> String {
        let mut response = object(identity, "failed", json!([]), Value::Null);
        response["error"] = json!({"code": "server_error", "message": "simulated mid-stream failure"});
        event("response.failed", json!({"response": response}))
    }
}

/// The Messages API's events.
pub mod messages {
    use super::*;

    /// `message_start`, with the input tokens.
    pub fn start(identity: &Identity<'_>, prompt_tokens: u64) -> String {
        event(
            "message_start",
            json!({"message": {
                "id": format!("msg_{}", identity.id), "type": "message", "role": "assistant", "content": [],
                "model": identity.model, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
            }}),
        )
    }

    /// `content_block_start` of a thinking or text block.
    pub fn open(reasoning: bool, index: u32) -> String {
        let block = if reasoning {
            json!({"type": "thinking", "thinking": "", "signature": ""})
        } else {
            json!({"type": "text", "text": ""})
        };
        event("content_block_start", json!({"index": index, "content_block": block}))
    }

    /// One `content_block_delta`.
    pub fn delta(reasoning: bool, index: u32, text: &str) -> String {
        let delta = if reasoning {
            json!({"type": "thinking_delta", "thinking": text})
        } else {
            json!({"type": "text_delta", "text": text})
        };
        event("content_block_delta", json!({"index": index, "delta": delta}))
    }

    /// `content_block_stop`.
    pub fn close(index: u32) -> String {
        event("content_block_stop", json!({"index": index}))
    }

    /// `message_delta` with the usage, then `message_stop`.
    pub fn end(prompt_tokens: u64, output_tokens: u64) -> String {
        event(
            "message_delta",
            json!({"delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": output_tokens}}),
        ) + &event("message_stop", json!({}))
    }

    /// An `error` event: the engine is overloaded.
    pub fn overloaded() -> String {
        event(
            "error",
            json!({"error": {"type": "overloaded_error", "message": "simulated mid-stream failure"}}),
        )
    }

    /// A whole answer.
    pub fn whole(identity: &Identity<'_>, text: &str, prompt_tokens: u64, output_tokens: u64) -> Value {
        json!({
            "id": format!("msg_{}", identity.id), "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": text}], "model": identity.model,
            "stop_reason": "max_tokens", "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": output_tokens},
        })
    }

    /// An Anthropic-shaped error body.
    pub fn error_body(kind: &str, message: &str) -> Value {
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }
}
