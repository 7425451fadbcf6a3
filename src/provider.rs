//! Which engine is behind the sidecar: configured (`engine: vllm`), or learned with
//! `engine: auto` from what the upstream says about itself.
//!
//! How `auto` decides, first answer wins:
//! 1. `GET /v1/models`, probed at start and with every health probe until decided:
//!    `owned_by` is `vllm`, `sglang` or `llamacpp` as those servers write it (llama-cpp-python
//!    writes `me`); TGI writes the
//!    model id itself into `owned_by`; anything else is `openai`.
//! 2. Where `/v1/models` does not answer 200: `GET /info` naming TGI's router.
//! 3. A response carrying TGI's `x-compute-type` header, or a TGI-native stream.
//!
//! Until one of these answers, requests are labelled `provider="unknown"`.

use crate::record::Engine;
use http::HeaderMap;
use serde::Deserialize;
use std::sync::OnceLock;

/// Label value before the engine is known.
pub const UNKNOWN: &str = "unknown";

/// The engine kind, fixed by configuration or learned once.
#[derive(Debug, Default)]
pub struct Provider {
    configured: Option<Engine>,
    learned: OnceLock<Engine>,
}

impl Provider {
    /// A provider fixed to `configured`, or learning when `None`.
    pub fn new(configured: Option<Engine>) -> Self {
        Self {
            configured,
            learned: OnceLock::new(),
        }
    }

    /// The engine, when known.
    pub fn engine(&self) -> Option<Engine> {
        self.configured.or(self.learned.get().copied())
    }

    /// The `provider` label value.
    pub fn label(&self) -> &'static str {
        self.engine().map_or(UNKNOWN, Engine::as_str)
    }

    /// Records what was learned; true when this decided it.
    pub fn learn(&self, engine: Engine) -> bool {
        self.engine().is_none() && self.learned.set(engine).is_ok()
    }
}

/// The engine a `/v1/models` answer points to, with the model ids it lists.
pub fn from_models(body: &[u8]) -> Option<(Engine, Vec<String>)> {
    #[derive(Deserialize)]
    struct Models {
        data: Vec<Model>,
    }
    #[derive(Deserialize)]
    struct Model {
        id: String,
        #[serde(default)]
        owned_by: String,
    }
    let models: Models = serde_json::from_slice(body).ok()?;
    let first = models.data.first()?;
    let engine = match first.owned_by.as_str() {
        "vllm" => Engine::Vllm,
        "sglang" => Engine::Sglang,
        // llama.cpp's server writes `llamacpp`, llama-cpp-python writes `me`.
        "llamacpp" | "me" => Engine::Llamacpp,
        owner if owner == first.id => Engine::Tgi,
        _ => Engine::Openai,
    };
    Some((engine, models.data.into_iter().map(|m| m.id).collect()))
}

/// TGI's `/info` names its router.
pub fn from_info(body: &[u8]) -> Option<Engine> {
    #[derive(Deserialize)]
    struct Info {
        router: String,
    }
    let info: Info = serde_json::from_slice(body).ok()?;
    info.router.contains("text-generation").then_some(Engine::Tgi)
}

/// Response headers only one engine sets.
pub fn from_headers(headers: &HeaderMap) -> Option<Engine> {
    headers.contains_key("x-compute-type").then_some(Engine::Tgi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_by_tells_the_engines_apart() {
        let models = |owned_by: &str| {
            format!(r#"{{"object":"list","data":[{{"id":"m","object":"model","owned_by":"{owned_by}"}}]}}"#)
        };
        assert_eq!(from_models(models("vllm").as_bytes()).unwrap().0, Engine::Vllm);
        assert_eq!(from_models(models("sglang").as_bytes()).unwrap().0, Engine::Sglang);
        assert_eq!(from_models(models("llamacpp").as_bytes()).unwrap().0, Engine::Llamacpp);
        assert_eq!(from_models(models("m").as_bytes()).unwrap().0, Engine::Tgi);
        assert_eq!(from_models(models("openai").as_bytes()).unwrap().0, Engine::Openai);
        assert_eq!(from_models(models("vllm").as_bytes()).unwrap().1, ["m"]);
        assert!(from_models(b"{\"data\":[]}").is_none());
        assert!(from_models(b"<html>").is_none());
    }

    #[test]
    fn info_and_headers_identify_tgi() {
        assert_eq!(
            from_info(br#"{"model_id":"x","router":"text-generation-router"}"#),
            Some(Engine::Tgi)
        );
        assert_eq!(from_info(br#"{"router":"other"}"#), None);
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers), None);
        headers.insert("x-compute-type", "gpu+optimized".parse().unwrap());
        assert_eq!(from_headers(&headers), Some(Engine::Tgi));
    }

    #[test]
    fn learning_happens_once_and_never_overrides_configuration() {
        let auto = Provider::new(None);
        assert_eq!(auto.label(), UNKNOWN);
        assert!(auto.learn(Engine::Sglang));
        assert!(!auto.learn(Engine::Vllm));
        assert_eq!(auto.label(), "sglang");
        let fixed = Provider::new(Some(Engine::Vllm));
        assert!(!fixed.learn(Engine::Tgi));
        assert_eq!(fixed.label(), "vllm");
    }
}
