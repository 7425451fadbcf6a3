//! The engine-specific shapes of the simulated engine's answers: vLLM, TGI (its OpenAI
//! routes and its native generate API) and llama.cpp; the Responses and Messages APIs as
//! vLLM serves them (in `typed`).

use super::typed::{messages, responses, Identity};
use crate::record::Operation;
use serde::Serialize;
use serde_json::{json, Value};
use std::io;

/// Which engine the simulator imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    /// vLLM: a role-only first chunk per choice, a usage-only chunk when asked.
    Vllm,
    /// TGI: no role-only chunk (every delta carries the role), native `/generate_stream`,
    /// `x-compute-type` headers, `owned_by` = the model id.
    Tgi,
    /// llama.cpp: a role chunk with `content: null`, `", "` separators, no usage chunk.
    Llamacpp,
}

impl Flavor {
    /// What `/v1/models` says in `owned_by` for `model`.
    pub fn owned_by(self, model: &str) -> String {
        match self {
            Flavor::Vllm => "vllm".to_string(),
            Flavor::Tgi => model.to_string(),
            Flavor::Llamacpp => "llamacpp".to_string(),
        }
    }

    /// Whether it answers a usage request with a usage chunk.
    pub fn sends_usage(self) -> bool {
        self != Flavor::Llamacpp
    }
}

/// Identity and shape shared by every event of one response.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The engine imitated.
    pub flavor: Flavor,
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// Chat, completions, TGI's native generate, Responses or Messages.
    pub operation: Operation,
    /// Prompt tokens, which the Messages API states in its first event.
    pub prompt_tokens: u64,
    /// Whether the answer is preceded by reasoning (its own item or block).
    pub reasons_first: bool,
}

impl Shape {
    /// What every event of the typed APIs names.
    fn identity(&self) -> Identity<'_> {
        Identity {
            id: &self.id,
            created: self.created,
            model: &self.model,
        }
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.operation, streaming) {
            (Operation::Chat, true) => "chat.completion.chunk",
            (Operation::Chat, false) => "chat.completion",
            _ => "text_completion",
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A streamed chunk carrying `choice`, typed: built for every token, so no map is built.
    fn typed_chunk<'a, C: Serialize>(&'a self, choice: C) -> Chunk<'a, C> {
        Chunk {
            id: &self.id,
            object: self.object(true),
            created: self.created,
            model: &self.model,
            choices: [choice],
        }
    }

    /// One SSE event in this engine's formatting.
    fn event<T: Serialize>(&self, value: &T) -> String {
        match (self.flavor, self.operation) {
            (_, Operation::Generate) => format!("data:{}\n\n", to_json(value, false)),
            (Flavor::Llamacpp, _) => format!("data: {}\n\n", to_json(value, true)),
            _ => format!("data: {}\n\n", to_json(value, false)),
        }
    }

    /// The events before the first token: a role-only chunk per choice where the engine sends one.
    pub fn opening(&self, choices: u32) -> Vec<String> {
        if self.operation == Operation::Responses {
            return responses::opening(&self.identity());
        }
        let role = match (self.flavor, self.operation) {
            (Flavor::Vllm, Operation::Chat) => json!({"role": "assistant", "content": ""}),
            (Flavor::Llamacpp, Operation::Chat) => json!({"role": "assistant", "content": null}),
            _ => return Vec::new(),
        };
        (0..choices)
            .map(|index| {
                let choice = json!([{"index": index, "delta": role, "logprobs": null, "finish_reason": null}]);
                self.event(&self.chunk(choice))
            })
            .collect()
    }

    /// The index of the Responses output item or Messages content block of the reasoning
    /// (0) or the answer (after the reasoning, if any).
    fn block_index(&self, reasoning: bool) -> u32 {
        u32::from(!reasoning && self.reasons_first)
    }

    /// The events that open a reasoning or answer block of the typed APIs (Messages: with
    /// `message_start` before the first); nothing for the others.
    pub fn open_block(&self, reasoning: bool, first: bool) -> String {
        let index = self.block_index(reasoning);
        match self.operation {
            Operation::Responses => responses::open(reasoning, index),
            Operation::Messages if first => {
                messages::start(&self.identity(), self.prompt_tokens) + &messages::open(reasoning, index)
            }
            Operation::Messages => messages::open(reasoning, index),
            _ => String::new(),
        }
    }

    /// The events that close a reasoning or answer block whose whole text is `text`.
    pub fn close_block(&self, reasoning: bool, text: &str) -> String {
        let index = self.block_index(reasoning);
        match self.operation {
            Operation::Responses => responses::close(reasoning, index, text),
            Operation::Messages => messages::close(index),
            _ => String::new(),
        }
    }

    /// An event carrying `text` for one choice; `reasoning` puts it in `reasoning_content`
    /// (a reasoning item or thinking block in the typed APIs). `step` numbers TGI's tokens;
    /// `finish` (with the whole text for TGI) marks the last.
    pub fn token(&self, choice: u32, step: u32, text: &str, reasoning: bool, finish: Option<(&str, u32)>) -> String {
        let finish_reason = finish.map(|_| "length");
        let value = match self.operation {
            Operation::Responses => return responses::delta(reasoning, self.block_index(reasoning), text),
            Operation::Messages => return messages::delta(reasoning, self.block_index(reasoning), text),
            Operation::Generate => json!({
                "index": step,
                "token": {"id": step, "text": text, "logprob": -0.25, "special": false},
                "generated_text": finish.map(|(all, _)| all),
                "details": finish.map(|(_, n)| json!({"finish_reason": "length", "generated_tokens": n, "seed": null})),
            }),
            Operation::TextCompletion => {
                return self.event(&self.typed_chunk(TextChoice {
                    index: choice,
                    text,
                    logprobs: None,
                    finish_reason,
                }))
            }
            _ => {
                let delta = Delta {
                    reasoning_content: reasoning.then_some(text),
                    content: (!reasoning).then_some(text),
                    role: (self.flavor == Flavor::Tgi).then_some("assistant"),
                };
                return self.event(&self.typed_chunk(ChatChoice {
                    index: choice,
                    delta,
                    logprobs: None,
                    finish_reason,
                }));
            }
        };
        self.event(&value)
    }

    /// The usage-only chunk, where this engine sends one, with the request's own `metrics`
    /// when the engine states them.
    pub fn usage(&self, prompt_tokens: u64, completion_tokens: u64, metrics: Option<&Value>) -> Option<String> {
        if !self.flavor.sends_usage() || !matches!(self.operation, Operation::Chat | Operation::TextCompletion) {
            return None;
        }
        let mut chunk = self.chunk(json!([]));
        chunk["usage"] = usage(prompt_tokens, completion_tokens);
        if let Some(metrics) = metrics {
            chunk["metrics"] = metrics.clone();
        }
        Some(self.event(&chunk))
    }

    /// The closing sentinel (TGI's native stream and the typed APIs have none).
    pub fn done(&self) -> Option<String> {
        matches!(self.operation, Operation::Chat | Operation::TextCompletion).then(|| "data: [DONE]\n\n".to_string())
    }

    /// The events after the last token: the usage chunk when asked for and `[DONE]`; for the
    /// typed APIs, the last block's close and the terminal events with usage.
    /// `last_block` is the last block's kind (reasoning or not) and whole text.
    pub fn closing(
        &self,
        include_usage: bool,
        output_tokens: u64,
        reasoning_tokens: u64,
        last_block: (bool, &str),
        answer: &str,
        metrics: Option<&Value>,
    ) -> Vec<String> {
        let close = self.close_block(last_block.0, last_block.1);
        match self.operation {
            Operation::Responses => {
                let usage = responses::usage(self.prompt_tokens, output_tokens, reasoning_tokens);
                vec![close + &responses::completed(&self.identity(), answer, usage, metrics)]
            }
            Operation::Messages => vec![close + &messages::end(self.prompt_tokens, output_tokens)],
            _ => [
                include_usage
                    .then(|| self.usage(self.prompt_tokens, output_tokens, metrics))
                    .flatten(),
                self.done(),
            ]
            .into_iter()
            .flatten()
            .collect(),
        }
    }

    /// An error event in the middle of a stream.
    pub fn error(&self) -> String {
        match self.operation {
            Operation::Responses => responses::failed(&self.identity()),
            Operation::Messages => messages::overloaded(),
            Operation::Generate => self.event(&json!({
                "error": "Request failed during generation: simulated failure",
                "error_type": "incomplete_generation_stream",
            })),
            _ => self.event(&error_body("simulated mid-stream failure", "InternalServerError", 500)),
        }
    }

    /// A whole non-streaming answer with one text per choice.
    pub fn whole(&self, texts: &[String], prompt_tokens: u64, completion_tokens: u64) -> Value {
        let first = texts.first().map_or("", String::as_str);
        match self.operation {
            Operation::Responses => {
                let output = json!([{"id": "msg_sim", "type": "message", "role": "assistant", "status": "completed",
                                     "content": [{"type": "output_text", "text": first, "annotations": []}]}]);
                let usage = responses::usage(prompt_tokens, completion_tokens, 0);
                return responses::object(&self.identity(), "incomplete", output, usage);
            }
            Operation::Messages => return messages::whole(&self.identity(), first, prompt_tokens, completion_tokens),
            _ => {}
        }
        let choices: Vec<Value> = texts
            .iter()
            .enumerate()
            .map(|(index, text)| match self.operation {
                Operation::Chat => json!({
                    "index": index, "message": {"role": "assistant", "content": text}, "logprobs": null,
                    "finish_reason": "length"
                }),
                _ => json!({"index": index, "text": text, "logprobs": null, "finish_reason": "length"}),
            })
            .collect();
        if self.operation == Operation::Generate {
            return json!({
                "generated_text": texts.first().cloned().unwrap_or_default(),
                "details": {"finish_reason": "length", "generated_tokens": completion_tokens, "seed": null},
            });
        }
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens),
        })
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

/// A streamed chunk of the OpenAI APIs with its one choice, fields in the engines' order.
#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [C; 1],
}

/// A chat chunk's choice.
#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

/// A chat delta: its text as the answer or the reasoning, and the role where the engine repeats it.
#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
}

/// A completions chunk's choice.
#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

/// JSON text, compact or with Python's default `", "` and `": "` separators.
pub fn to_json<T: Serialize + ?Sized>(value: &T, spaced: bool) -> String {
    if !spaced {
        return serde_json::to_string(value).expect("the simulator's JSON always serializes");
    }
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, Spaced);
    value.serialize(&mut serializer).expect("a Value always serializes");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// `{"a": 1, "b": [1, 2]}` formatting.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(flavor: Flavor, operation: Operation) -> Shape {
        Shape {
            flavor,
            id: "x".into(),
            created: 1,
            model: "m".into(),
            operation,
            prompt_tokens: 5,
            reasons_first: false,
        }
    }

    #[test]
    fn spaced_separators() {
        assert_eq!(
            to_json(&json!({"a": [1, 2], "b": null}), true),
            r#"{"a": [1, 2], "b": null}"#
        );
    }

    #[test]
    fn openings_per_engine() {
        assert_eq!(shape(Flavor::Vllm, Operation::Chat).opening(2).len(), 2);
        assert!(shape(Flavor::Tgi, Operation::Chat).opening(1).is_empty());
        assert!(shape(Flavor::Llamacpp, Operation::Chat).opening(1)[0].contains(r#""content": null"#));
        assert!(shape(Flavor::Vllm, Operation::TextCompletion).opening(1).is_empty());
    }

    #[test]
    fn tgi_native_events() {
        let s = shape(Flavor::Tgi, Operation::Generate);
        let last = s.token(0, 3, " c", false, Some((" a b c", 3)));
        assert!(last.starts_with("data:{"));
        assert!(last.contains(r#""generated_tokens":3"#));
        assert!(s.done().is_none() && s.usage(1, 3, None).is_none());
        assert!(s.error().contains("incomplete_generation_stream"));
    }

    #[test]
    fn token_chunks_keep_the_engines_field_order() {
        let vllm = shape(Flavor::Vllm, Operation::Chat);
        assert_eq!(
            vllm.token(0, 1, "hi", false, Some(("hi", 1))),
            "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
             \"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n"
        );
        assert_eq!(
            shape(Flavor::Llamacpp, Operation::Chat).token(1, 1, "t", true, None),
            "data: {\"id\": \"x\", \"object\": \"chat.completion.chunk\", \"created\": 1, \"model\": \"m\", \
             \"choices\": [{\"index\": 1, \"delta\": {\"reasoning_content\": \"t\"}, \"logprobs\": null, \"finish_reason\": null}]}\n\n"
        );
        assert_eq!(
            shape(Flavor::Tgi, Operation::Chat).token(0, 1, "a", false, None),
            "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
             \"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\",\"role\":\"assistant\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        );
        assert_eq!(
            shape(Flavor::Vllm, Operation::TextCompletion).token(0, 1, "\"q\"", false, None),
            "data: {\"id\":\"x\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\
             \"choices\":[{\"index\":0,\"text\":\"\\\"q\\\"\",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        );
    }

    #[test]
    fn tgi_chat_deltas_carry_the_role() {
        let event = shape(Flavor::Tgi, Operation::Chat).token(0, 1, "hi", false, None);
        assert!(event.contains(r#""role":"assistant""#) && event.contains(r#""content":"hi""#));
    }
}
