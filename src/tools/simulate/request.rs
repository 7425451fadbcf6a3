//! What the simulated engine reads of a request: the fields it honours, and a rough count of
//! its prompt tokens.

use super::respond::{bad_request, SimBody};
use crate::observe::tokens::TokenCounter;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use std::sync::Arc;

/// Largest request body the simulated engine reads.
const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The fields of a generation request the simulator honours.
#[derive(Debug, Deserialize)]
pub(super) struct GenerationRequest {
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) stream: bool,
    pub(super) max_tokens: Option<u32>,
    pub(super) max_completion_tokens: Option<u32>,
    /// The Responses API's limit.
    pub(super) max_output_tokens: Option<u32>,
    /// The Responses API's input.
    pub(super) input: Option<serde_json::Value>,
    pub(super) n: Option<u32>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) messages: Option<Vec<serde_json::Value>>,
    pub(super) prompt: Option<serde_json::Value>,
    /// TGI native: the prompt.
    pub(super) inputs: Option<serde_json::Value>,
    /// TGI native: `max_new_tokens` and friends.
    pub(super) parameters: Option<TgiParameters>,
    /// vLLM's disaggregated-serving parameters.
    pub(super) kv_transfer_params: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub(super) struct TgiParameters {
    pub(super) max_new_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

/// Reads a request body as the fields the simulator honours, or the 400 to answer.
pub(super) async fn read_request(request: Request<Incoming>) -> Result<GenerationRequest, Response<SimBody>> {
    let body = match Limited::new(request.into_body(), MAX_REQUEST_BYTES).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Err(bad_request("request body too large or unreadable")),
    };
    serde_json::from_slice(&body).map_err(|e| bad_request(&format!("invalid JSON body: {e}")))
}

/// How the simulated engine counts a prompt's tokens for its usage.
#[derive(Debug, Clone)]
pub struct PromptCounting {
    /// Characters a token, where no tokenizer is set.
    pub chars_per_token: u32,
    /// A tokenizer that counts the prompt's text instead.
    pub tokenizer: Option<Arc<TokenCounter>>,
    /// Tokens a chat template adds to every prompt sent as messages (chat, Messages) or as a
    /// Responses `input`.
    pub template_tokens: u32,
}

impl Default for PromptCounting {
    /// Four characters a token, no template: a rough count of any text.
    fn default() -> Self {
        Self {
            chars_per_token: 4,
            tokenizer: None,
            template_tokens: 0,
        }
    }
}

impl PromptCounting {
    /// The prompt tokens of `request` (at least one): its messages' or prompt's text, by the
    /// tokenizer or by characters, and the template's tokens where it was sent as messages.
    pub(super) fn count(&self, request: &GenerationRequest) -> u64 {
        /// Calls `each` on every text of a prompt or message: a string, or the `content` and
        /// `text` of the objects and lists around it.
        fn texts<'a>(value: &'a serde_json::Value, each: &mut impl FnMut(&'a str)) {
            match value {
                serde_json::Value::String(s) => each(s),
                serde_json::Value::Array(items) => items.iter().for_each(|item| texts(item, each)),
                serde_json::Value::Object(map) => ["content", "text"]
                    .iter()
                    .filter_map(|k| map.get(*k))
                    .for_each(|item| texts(item, each)),
                _ => {}
            }
        }
        let prompt = request.prompt.as_ref().or(request.inputs.as_ref());
        let sources = request
            .messages
            .iter()
            .flatten()
            .chain(prompt.or(request.input.as_ref()));
        let text = match &self.tokenizer {
            Some(tokenizer) => {
                let mut parts = Vec::new();
                sources.for_each(|source| texts(source, &mut |t| parts.push(t)));
                tokenizer.count(&parts.join("\n")).unwrap_or(0)
            }
            None => {
                let mut chars = 0u64;
                sources.for_each(|source| texts(source, &mut |t| chars += t.chars().count() as u64));
                chars / u64::from(self.chars_per_token.max(1))
            }
        };
        let templated = request.messages.is_some() || request.input.is_some();
        (text + if templated { u64::from(self.template_tokens) } else { 0 }).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_are_a_quarter_of_the_text() {
        let request: GenerationRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":"one two three"},{"role":"user","content":[{"type":"text","text":"xyz"}]}]}"#,
        )
        .unwrap();
        let counting = |chars_per_token| PromptCounting {
            chars_per_token,
            ..PromptCounting::default()
        };
        assert_eq!(counting(4).count(&request), 4, "16 characters");
        let templated = PromptCounting {
            template_tokens: 7,
            ..counting(4)
        };
        assert_eq!(templated.count(&request), 11, "and the chat template's");
        let request: GenerationRequest = serde_json::from_str(r#"{"prompt":"a b"}"#).unwrap();
        assert_eq!(counting(4).count(&request), 1, "at least one");
        assert_eq!(counting(1).count(&request), 3, "a tokenizer of a character a token");
        assert_eq!(templated.count(&request), 1, "a plain prompt has no template");
    }

    #[test]
    fn a_tokenizer_counts_the_text_it_was_given() {
        let tokenizer = TokenCounter::load(std::path::Path::new("tests/fixtures/tokenizer")).unwrap();
        let expected = tokenizer.count("one two three\nxyz").unwrap();
        let counting = PromptCounting {
            tokenizer: Some(Arc::new(tokenizer)),
            template_tokens: 2,
            ..PromptCounting::default()
        };
        let request: GenerationRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":"one two three"},{"role":"user","content":"xyz"}]}"#,
        )
        .unwrap();
        assert_eq!(counting.count(&request), expected + 2);
    }
}
