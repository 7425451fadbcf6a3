//! The simulated engine as one half of a disaggregated pair, following vLLM's
//! `kv_transfer_params` contract (its NIXL connector): a prefill engine answers a prefill leg
//! (`do_remote_decode: true`) with one token and the parameters that say where the KV blocks
//! are; a decode engine given those (`do_remote_prefill: true`) skips the prefill and waits
//! for the blocks to arrive instead. A decode leg that names no prefilled blocks fails.

use serde_json::{json, Value};
use std::time::Duration;

/// How an engine of a disaggregated pair behaves (either engine answers either leg, as
/// vLLM's `kv_both` engines do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdOptions {
    /// Prefill time per prompt token, added to the TTFT of every request that prefills here.
    pub prefill_per_token: Duration,
    /// KV transfer time per prompt token, waited by a decode leg before its first step.
    pub transfer_per_token: Duration,
}

/// The engine id a simulated prefill engine names in the parameters it answers.
pub const PREFILL_ENGINE_ID: &str = "llmslo-sim-prefill";

/// What a request's `kv_transfer_params` ask of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRequest {
    /// None: an ordinary request, prefilled and decoded here.
    None,
    /// Prefill only, keeping the KV blocks for a remote decode.
    Prefill,
    /// Decode with the KV blocks a prefill engine made.
    Decode,
    /// Decode, but the parameters name no prefilled blocks: vLLM fails such a request.
    DecodeWithoutBlocks,
}

impl KvRequest {
    /// Reads a request's `kv_transfer_params`.
    pub fn of(params: Option<&Value>) -> Self {
        let Some(params) = params.filter(|p| p.is_object()) else {
            return KvRequest::None;
        };
        let flag = |name: &str| params.get(name).and_then(Value::as_bool) == Some(true);
        if flag("do_remote_decode") {
            return KvRequest::Prefill;
        }
        if !flag("do_remote_prefill") {
            return KvRequest::None;
        }
        let blocks = params
            .get("remote_block_ids")
            .and_then(Value::as_array)
            .is_some_and(|ids| !ids.is_empty());
        let engine = params.get("remote_engine_id").and_then(Value::as_str) == Some(PREFILL_ENGINE_ID);
        if blocks && engine {
            KvRequest::Decode
        } else {
            KvRequest::DecodeWithoutBlocks
        }
    }
}

impl PdOptions {
    /// The time before the first token of a request of `prompt_tokens` asking `kv`, on an
    /// engine whose own TTFT is `ttft` and step `tpot`.
    pub fn first_token(&self, kv: KvRequest, prompt_tokens: u64, ttft: Duration, tpot: Duration) -> Duration {
        let per_prompt =
            |per_token: Duration| per_token.saturating_mul(u32::try_from(prompt_tokens).unwrap_or(u32::MAX));
        match kv {
            KvRequest::Decode => per_prompt(self.transfer_per_token) + tpot,
            _ => ttft + per_prompt(self.prefill_per_token),
        }
    }
}

/// The `kv_transfer_params` a prefill engine answers: where the decode engine finds the
/// blocks of request `serial`.
pub fn prefilled(serial: u64, prompt_tokens: u64) -> Value {
    let blocks: Vec<u64> = (0..prompt_tokens.div_ceil(16).max(1))
        .map(|b| serial * 1_000 + b)
        .collect();
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": blocks,
        "remote_engine_id": PREFILL_ENGINE_ID,
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_say_which_leg_and_a_decode_needs_prefilled_blocks() {
        assert_eq!(KvRequest::of(None), KvRequest::None);
        assert_eq!(
            KvRequest::of(Some(&json!({"do_remote_decode": true, "do_remote_prefill": false}))),
            KvRequest::Prefill
        );
        assert_eq!(KvRequest::of(Some(&prefilled(3, 40))), KvRequest::Decode);
        let forwarded_unchanged =
            json!({"do_remote_decode": false, "do_remote_prefill": true, "remote_block_ids": null});
        assert_eq!(
            KvRequest::of(Some(&forwarded_unchanged)),
            KvRequest::DecodeWithoutBlocks
        );
        let pd = PdOptions {
            prefill_per_token: Duration::from_millis(1),
            transfer_per_token: Duration::from_micros(100),
        };
        let (ttft, tpot) = (Duration::from_millis(50), Duration::from_millis(10));
        assert_eq!(
            pd.first_token(KvRequest::Prefill, 100, ttft, tpot),
            Duration::from_millis(150)
        );
        assert_eq!(
            pd.first_token(KvRequest::Decode, 100, ttft, tpot),
            Duration::from_millis(20)
        );
        assert_eq!(
            pd.first_token(KvRequest::None, 100, ttft, tpot),
            Duration::from_millis(150)
        );
    }
}
