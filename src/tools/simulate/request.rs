//! What the simulated engine reads of a request: the fields it honours, and a rough count of
//! its prompt tokens.

use super::respond::{bad_request, SimBody};
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

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

/// A rough prompt token count: the characters of the messages or prompt over
/// `chars_per_token` (at least one).
pub(super) fn prompt_tokens(request: &GenerationRequest, chars_per_token: u32) -> u64 {
    fn count_chars(value: &serde_json::Value) -> u64 {
        match value {
            serde_json::Value::String(s) => s.chars().count() as u64,
            serde_json::Value::Array(items) => items.iter().map(count_chars).sum(),
            serde_json::Value::Object(map) => ["content", "text"]
                .iter()
                .filter_map(|k| map.get(*k))
                .map(count_chars)
                .sum(),
            _ => 0,
        }
    }
    let messages = request.messages.iter().flatten().map(count_chars).sum::<u64>();
    let prompt = request
        .prompt
        .as_ref()
        .or(request.inputs.as_ref())
        .or(request.input.as_ref())
        .map_or(0, count_chars);
    ((messages + prompt) / u64::from(chars_per_token.max(1))).max(1)
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
        assert_eq!(prompt_tokens(&request, 4), 4, "16 characters");
        let request: GenerationRequest = serde_json::from_str(r#"{"prompt":"a b"}"#).unwrap();
        assert_eq!(prompt_tokens(&request, 4), 1, "at least one");
        assert_eq!(prompt_tokens(&request, 1), 3, "a tokenizer of a character a token");
    }
}
