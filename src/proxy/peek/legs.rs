//! What makes a request a leg of a disaggregated request: vLLM's `kv_transfer_params` and
//! SGLang's `bootstrap_room`, read without building their values.

use crate::record::LegPhase;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The leg `kv_transfer_params` make of a request, as vLLM's KV connectors read them:
/// `do_remote_decode: true` is a prefill leg, else `do_remote_prefill: true` a decode leg. Any
/// other value (null, no flag set, flags that are not booleans) makes no leg.
pub(super) struct LegOrNone(pub(super) Option<LegPhase>);

impl<'de> Deserialize<'de> for LegOrNone {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(LegOrNone(match deserializer.deserialize_any(Params)? {
            Read::Params(leg) => leg,
            Read::Flag(_) | Read::Other => None,
        }))
    }
}

/// Whether a value is there and not `null`; it is skipped without being built.
pub(super) struct NotNull(pub(super) bool);

impl<'de> Deserialize<'de> for NotNull {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value: Option<IgnoredAny> = Deserialize::deserialize(deserializer)?;
        Ok(NotNull(value.is_some()))
    }
}

/// What a value of `kv_transfer_params` (or one of its members) reads as.
enum Read {
    /// A boolean: a flag's value.
    Flag(bool),
    /// An object: the leg its flags make.
    Params(Option<LegPhase>),
    /// Anything else, skipped.
    Other,
}

/// Reads any JSON value as a [`Read`], skipping what it does not need without building it.
struct Params;

impl<'de> Deserialize<'de> for Read {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Params)
    }
}

impl<'de> Visitor<'de> for Params {
    type Value = Read;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read, A::Error> {
        let (mut remote_decode, mut remote_prefill) = (false, false);
        while let Some(name) = map.next_key::<super::Capped>()? {
            let set = matches!(map.next_value::<Read>()?, Read::Flag(true));
            match name.0.as_str() {
                "do_remote_decode" => remote_decode |= set,
                "do_remote_prefill" => remote_prefill |= set,
                _ => {}
            }
        }
        Ok(Read::Params(if remote_decode {
            Some(LegPhase::Prefill)
        } else if remote_prefill {
            Some(LegPhase::Decode)
        } else {
            None
        }))
    }
    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Read, E> {
        Ok(Read::Flag(value))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Read, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Read::Other)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Read, E> {
        Ok(Read::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Read, E> {
        Ok(Read::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Read, E> {
        Ok(Read::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Read, E> {
        Ok(Read::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Read, E> {
        Ok(Read::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_fields, RequestFields};
    use crate::observe::tenants::TenantFields;
    use crate::record::LegPhase;

    const NONE: TenantFields = TenantFields {
        safety_identifier: false,
        user: false,
        metadata_user_id: false,
    };

    #[test]
    fn sglangs_bootstrap_room_marks_a_leg() {
        let room = |value: &str| parse_fields(format!(r#"{{"model":"m","bootstrap_room":{value}}}"#).as_bytes(), NONE);
        assert!(room("8812093458").bootstrap_room);
        assert!(room(r#"[1,2]"#).bootstrap_room, "a batch's rooms");
        assert!(!room("null").bootstrap_room);
        assert!(!parse_fields(br#"{"model":"m"}"#, NONE).bootstrap_room);
    }

    #[test]
    fn kv_transfer_params_make_a_leg_as_vllms_connectors_read_them() {
        let leg = |params: &str| {
            parse_fields(
                format!(r#"{{"model":"m","kv_transfer_params":{params}}}"#).as_bytes(),
                NONE,
            )
            .leg
        };
        // What llm-d's routing sidecar sends the prefill pod, and then the decode engine.
        let prefill =
            r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null}"#;
        let decode = r#"{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[1,2],"remote_host":"10.0.0.5","remote_port":5600}"#;
        assert_eq!(leg(prefill), Some(LegPhase::Prefill));
        assert_eq!(leg(decode), Some(LegPhase::Decode));
        for none in [
            "null",
            "{}",
            r#"{"do_remote_decode":"yes"}"#,
            r#"{"do_remote_prefill":[true]}"#,
            "[1]",
            "true",
            "7",
        ] {
            assert_eq!(leg(none), None, "{none}");
        }
        let fields = parse_fields(br#"{"model":"m","stream":true}"#, NONE);
        assert_eq!(
            (fields.leg, fields.model.as_deref()),
            (None, Some("m")),
            "no params, a user request"
        );
        // Named twice: ambiguous, nothing read (the request is measured as a user request).
        let twice = format!(r#"{{"model":"m","kv_transfer_params":{prefill},"kv_transfer_params":{prefill}}}"#);
        assert_eq!(parse_fields(twice.as_bytes(), NONE), RequestFields::default());
    }
}
