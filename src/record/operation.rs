//! Which requests llmslo measures: the route of a POST names its operation (the `operation`
//! label), and the operation names the wire protocol its answers speak.

/// The kind of work a request asks for, from its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    TextCompletion,
    /// TGI's native `POST /generate_stream` and `POST /generate`.
    Generate,
    /// OpenAI's Responses API, `POST /v1/responses`.
    Responses,
    /// Anthropic's Messages API, `POST /v1/messages`.
    Messages,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// vLLM's `POST /pooling`.
    Pooling,
    /// vLLM's `POST /classify`.
    Classify,
    /// `POST /score` and `POST /v1/score`.
    Score,
    /// `POST /rerank`, `/v1/rerank` and `/v2/rerank`.
    Rerank,
    /// `POST /v1/audio/transcriptions`.
    Transcription,
}

/// The wire protocol of a measured route's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OpenAI-compatible chat and completions chunks (and the JSON bodies of the other
    /// OpenAI-shaped routes).
    OpenAi,
    /// OpenAI's Responses API: typed `event:`s, no `[DONE]`.
    Responses,
    /// Anthropic's Messages API: typed `event:`s ending in `message_stop`.
    Messages,
    /// TGI's native generate API.
    Tgi,
}

impl Operation {
    /// Every operation, in label order.
    pub const ALL: [Operation; 11] = [
        Operation::Chat,
        Operation::TextCompletion,
        Operation::Generate,
        Operation::Responses,
        Operation::Messages,
        Operation::Embeddings,
        Operation::Pooling,
        Operation::Classify,
        Operation::Score,
        Operation::Rerank,
        Operation::Transcription,
    ];

    /// The `operation` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::TextCompletion => "text_completion",
            Operation::Generate => "generate",
            Operation::Responses => "responses",
            Operation::Messages => "messages",
            Operation::Embeddings => "embeddings",
            Operation::Pooling => "pooling",
            Operation::Classify => "classify",
            Operation::Score => "score",
            Operation::Rerank => "rerank",
            Operation::Transcription => "transcription",
        }
    }

    /// The protocol its answers speak.
    pub fn protocol(self) -> Protocol {
        match self {
            Operation::Generate => Protocol::Tgi,
            Operation::Responses => Protocol::Responses,
            Operation::Messages => Protocol::Messages,
            _ => Protocol::OpenAi,
        }
    }

    /// Whether it generates tokens on the engine's decode loop: such requests share the
    /// engine's load and have a first token. Embeddings, pooling, scoring, reranking and
    /// transcription are counted by outcome with e2e and their usage only.
    pub fn is_generation(self) -> bool {
        matches!(
            self,
            Operation::Chat
                | Operation::TextCompletion
                | Operation::Generate
                | Operation::Responses
                | Operation::Messages
        )
    }

    /// The operation a request asks for, if it is one llmslo measures (a POST to its path).
    pub fn of_request<B>(request: &http::Request<B>) -> Option<Self> {
        (request.method() == http::Method::POST)
            .then(|| Self::from_path(request.uri().path()))
            .flatten()
    }

    /// The operation served at `path`, if it is one llmslo measures.
    pub fn from_path(path: &str) -> Option<Self> {
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Operation::Chat),
            "/v1/completions" => Some(Operation::TextCompletion),
            "/generate_stream" | "/generate" => Some(Operation::Generate),
            "/v1/responses" => Some(Operation::Responses),
            "/v1/messages" => Some(Operation::Messages),
            "/v1/embeddings" => Some(Operation::Embeddings),
            "/pooling" => Some(Operation::Pooling),
            "/classify" => Some(Operation::Classify),
            "/score" | "/v1/score" => Some(Operation::Score),
            "/rerank" | "/v1/rerank" | "/v2/rerank" => Some(Operation::Rerank),
            "/v1/audio/transcriptions" => Some(Operation::Transcription),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_one_operation_and_others_have_none() {
        for (path, operation) in [
            ("/v1/chat/completions", Operation::Chat),
            ("/v1/completions/", Operation::TextCompletion),
            ("/generate_stream", Operation::Generate),
            ("/v1/responses", Operation::Responses),
            ("/v1/messages", Operation::Messages),
            ("/v1/embeddings", Operation::Embeddings),
            ("/pooling", Operation::Pooling),
            ("/classify", Operation::Classify),
            ("/v1/score", Operation::Score),
            ("/v2/rerank", Operation::Rerank),
            ("/v1/audio/transcriptions", Operation::Transcription),
        ] {
            assert_eq!(Operation::from_path(path), Some(operation), "{path}");
        }
        for path in [
            "/v1/messages/count_tokens",
            "/v1/responses/resp_1/cancel",
            "/tokenize",
            "/v1/models",
        ] {
            assert_eq!(Operation::from_path(path), None, "{path} is not generation");
        }
        let labels: std::collections::BTreeSet<_> = Operation::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Operation::ALL.len(), "label values are distinct");
    }

    #[test]
    fn only_decoding_routes_are_generation() {
        let generation: Vec<_> = Operation::ALL.into_iter().filter(|o| o.is_generation()).collect();
        assert_eq!(
            generation,
            [
                Operation::Chat,
                Operation::TextCompletion,
                Operation::Generate,
                Operation::Responses,
                Operation::Messages
            ]
        );
        assert_eq!(Operation::Messages.protocol(), Protocol::Messages);
        assert_eq!(Operation::Embeddings.protocol(), Protocol::OpenAi);
    }
}
