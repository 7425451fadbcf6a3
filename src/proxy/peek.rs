//! The bounded request peek: reads a generation request's body far enough to learn its
//! `model` and `stream` fields, then forwards the very same bytes.

mod legs;

use super::held::Held;
use super::request_body::ClientFault;
use super::UpstreamBody;
use crate::observe::tenants::TenantFields;
use crate::record::LegPhase;
use crate::upstream::BoxError;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use legs::{LegOrNone, NotNull};
use serde::de::{self, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The request fields llmslo reads; everything else in the body is skipped without being
/// built (no JSON tree), so what a body costs to read is bounded by its size, never by what
/// its fields contain.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestFields {
    /// `model`, when the body is JSON with a string model.
    pub model: Option<String>,
    /// `stream`, when present.
    pub stream: Option<bool>,
    /// `stream_options`, when present.
    pub stream_options: Option<StreamOptions>,
    /// OpenAI's `safety_identifier`, when a string and a tenant source.
    pub safety_identifier: Option<String>,
    /// OpenAI's `user`, when a string and a tenant source.
    pub user: Option<String>,
    /// Anthropic's `metadata.user_id`, when a string and a tenant source.
    pub metadata_user_id: Option<String>,
    /// The leg of a disaggregated request it is, when its `kv_transfer_params` say so.
    pub leg: Option<LegPhase>,
    /// SGLang's `bootstrap_room`: its router sends such a request to a prefill and a decode
    /// server at once, each a leg (which one, the pod's role says).
    pub bootstrap_room: bool,
}

/// Longest string value kept of a field. A longer one keeps its first bytes up to this bound,
/// which no label allows (models end at 128 bytes, tenants at 64), so it reads as `other`.
pub const MAX_FIELD_BYTES: usize = 256;

/// Reads [`RequestFields`] from a body's top-level object in one pass.
struct FieldsVisitor(TenantFields);

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = RequestFields;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RequestFields, A::Error> {
        let wanted = self.0;
        let mut fields = RequestFields::default();
        let mut seen = [false; 8];
        while let Some(key) = map.next_key::<Key>()? {
            // A field named twice is ambiguous (engines disagree on which counts): no fields.
            if let Some(slot) = key.slot() {
                if std::mem::replace(&mut seen[slot], true) {
                    return Err(A::Error::custom("a field is named twice"));
                }
            }
            match key {
                Key::Model => fields.model = map.next_value::<Option<Capped>>()?.map(|c| c.0),
                Key::Stream => fields.stream = map.next_value()?,
                Key::StreamOptions => fields.stream_options = map.next_value()?,
                Key::SafetyIdentifier if wanted.safety_identifier => {
                    fields.safety_identifier = map.next_value::<StringOrNone>()?.0
                }
                Key::User if wanted.user => fields.user = map.next_value::<StringOrNone>()?.0,
                Key::Metadata if wanted.metadata_user_id => {
                    fields.metadata_user_id = map.next_value::<UserIdOrNone>()?.0
                }
                Key::KvTransferParams => fields.leg = map.next_value::<LegOrNone>()?.0,
                Key::BootstrapRoom => fields.bootstrap_room = map.next_value::<NotNull>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// A top-level member's name, matched without copying it.
enum Key {
    Model,
    Stream,
    StreamOptions,
    SafetyIdentifier,
    User,
    Metadata,
    KvTransferParams,
    BootstrapRoom,
    Other,
}

impl Key {
    /// The field's place among those read, for the check that none is named twice.
    fn slot(&self) -> Option<usize> {
        match self {
            Key::Model => Some(0),
            Key::Stream => Some(1),
            Key::StreamOptions => Some(2),
            Key::SafetyIdentifier => Some(3),
            Key::User => Some(4),
            Key::Metadata => Some(5),
            Key::KvTransferParams => Some(6),
            Key::BootstrapRoom => Some(7),
            Key::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
                Ok(match name {
                    "model" => Key::Model,
                    "stream" => Key::Stream,
                    "stream_options" => Key::StreamOptions,
                    "safety_identifier" => Key::SafetyIdentifier,
                    "user" => Key::User,
                    "metadata" => Key::Metadata,
                    "kv_transfer_params" => Key::KvTransferParams,
                    "bootstrap_room" => Key::BootstrapRoom,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// A string, kept up to [`MAX_FIELD_BYTES`].
struct Capped(String);

impl Capped {
    fn of(value: &str) -> Self {
        let mut end = value.len().min(MAX_FIELD_BYTES);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        Capped(value[..end].to_string())
    }
}

impl<'de> Deserialize<'de> for Capped {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CappedVisitor;
        impl Visitor<'_> for CappedVisitor {
            type Value = Capped;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Capped, E> {
                Ok(Capped::of(value))
            }
        }
        deserializer.deserialize_str(CappedVisitor)
    }
}

/// A string field's value (capped); any other JSON value is skipped and reads as absent,
/// never as a failed body.
struct StringOrNone(Option<String>);

impl<'de> Deserialize<'de> for StringOrNone {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lookup::Text).map(StringOrNone)
    }
}

/// `metadata.user_id` when `metadata` is an object holding a string `user_id`; its other
/// members, and any other value, are skipped.
struct UserIdOrNone(Option<String>);

impl<'de> Deserialize<'de> for UserIdOrNone {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lookup::UserId).map(UserIdOrNone)
    }
}

/// What is looked for in any JSON value: the value itself when a string, or the string
/// `user_id` of an object. Everything else is skipped member by member without being built,
/// and scalars read as absent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lookup {
    Text,
    UserId,
}

impl<'de> Visitor<'de> for Lookup {
    type Value = Option<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, value: &str) -> Result<Option<String>, E> {
        Ok((self == Lookup::Text).then(|| Capped::of(value).0))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<String>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
        let mut user_id = None;
        while let Some(MemberName(is_user_id)) = map.next_key()? {
            if is_user_id && self == Lookup::UserId && user_id.is_none() {
                user_id = map.next_value::<StringOrNone>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(user_id)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
        Ok(None)
    }
}

/// Whether a member's name is `user_id`, matched without copying it.
struct MemberName(bool);

impl<'de> Deserialize<'de> for MemberName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = MemberName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<MemberName, E> {
                Ok(MemberName(name == "user_id"))
            }
        }
        deserializer.deserialize_identifier(NameVisitor)
    }
}

/// The part of `stream_options` llmslo reads.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct StreamOptions {
    /// `stream_options.include_usage`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

impl RequestFields {
    /// The client asked for the usage chunk itself.
    pub fn asked_for_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true)
    }
}

/// A peeked request body: whole (and so readable and rewritable) or too large.
pub enum Peeked {
    /// The whole body, within the limit, holding its share of the buffer budget.
    Whole(Bytes, Option<OwnedSemaphorePermit>),
    /// The first bytes and the rest, forwarded as they come.
    TooLarge(UpstreamBody),
}

/// Why the peek ended without a body to forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeekError {
    /// The client's body failed or broke a limit.
    Client(ClientFault),
    /// Buffering it would exceed `max_buffered_request_bytes` across all requests.
    BudgetExhausted,
}

/// A body of exactly `bytes` that gives its budget back when dropped.
pub fn buffered(bytes: Bytes, permit: Option<OwnedSemaphorePermit>) -> UpstreamBody {
    Held::new(Full::new(bytes), permit)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The same request asking for `stream_options.include_usage`, with every other byte the
/// client wrote kept as it was (numbers beyond 64 bits, key order, spacing): the field is
/// spliced in, never re-serialised. `None` when the body is not a JSON object, or names
/// `stream_options` (or its `include_usage`) twice, where engines disagree on which counts.
pub fn with_usage_requested(body: &[u8]) -> Option<Bytes> {
    // Valid JSON whose numbers are never converted, and an object.
    serde_json::from_slice::<serde::de::IgnoredAny>(body).ok()?;
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let Some((start, end)) = only_member(body, "stream_options")? else {
        return Some(inserted_after_brace(body, br#""stream_options":{"include_usage":true}"#)?.into());
    };
    let options = &body[start..end];
    let replacement = if options.starts_with(b"{") {
        match only_member(options, "include_usage")? {
            Some((value_start, value_end)) => [&options[..value_start], b"true", &options[value_end..]].concat(),
            None => inserted_after_brace(options, br#""include_usage":true"#)?,
        }
    } else {
        br#"{"include_usage":true}"#.to_vec()
    };
    Some([&body[..start], &replacement[..], &body[end..]].concat().into())
}

/// [`with_usage_requested`] with the copy it makes charged to `budget` while it is made, so
/// that a request's splice holds no memory beyond the buffer budget: the rewritten body and
/// its share, or the body as it was when it cannot be rewritten or the budget cannot hold the
/// copy (the request then goes on without usage asked for).
pub fn with_usage_requested_within(
    body: Bytes,
    permit: Option<OwnedSemaphorePermit>,
    budget: &Arc<Semaphore>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), (Bytes, Option<OwnedSemaphorePermit>)> {
    // The copy is the body and the member spliced in.
    const SPLICED: usize = r#""stream_options":{"include_usage":true},"#.len();
    let mut charge = Charge { permit };
    let held = charge.permit.as_ref().map_or(0, |p| p.num_permits());
    if charge.up_to(budget, held + body.len() + SPLICED).is_err() {
        return Err((body, charge.permit));
    }
    let Some(rewritten) = with_usage_requested(&body) else {
        charge.down_to(held);
        return Err((body, charge.permit));
    };
    drop(body);
    charge.down_to(rewritten.len());
    Ok((rewritten, charge.permit))
}

/// The byte span of the value of `object`'s member `key`: `Some(None)` when it has none,
/// `None` when it has it more than once.
fn only_member(object: &[u8], key: &str) -> Option<Option<(usize, usize)>> {
    let mut found = None;
    for member in sonic_rs::to_object_iter(object) {
        let (name, value) = member.ok()?;
        if name == key {
            if found.is_some() {
                return None;
            }
            let raw = value.as_raw_str().as_bytes();
            let start = (raw.as_ptr() as usize).checked_sub(object.as_ptr() as usize)?;
            found = Some((start, start + raw.len()));
        }
    }
    Some(found)
}

/// `object` with `member` inserted as its first member.
fn inserted_after_brace(object: &[u8], member: &[u8]) -> Option<Vec<u8>> {
    let open = object.iter().position(|b| *b == b'{')?;
    let empty = object[open + 1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let separator: &[u8] = if empty { b"" } else { b"," };
    Some([&object[..=open], member, separator, &object[open + 1..]].concat())
}

/// Parses the fields from a whole body, the tenant fields only when `tenants` reads them;
/// malformed JSON yields no fields (the engine answers it).
pub fn parse_fields(body: &[u8], tenants: TenantFields) -> RequestFields {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let fields = reader.deserialize_map(FieldsVisitor(tenants));
    fields
        .and_then(|fields| reader.end().map(|()| fields))
        .unwrap_or_default()
}

/// Reads up to `limit` bytes of `body`, taking from `budget` the memory they hold as they
/// arrive (a declared Content-Length sizes the buffer, but only the bytes received are
/// charged: a slow upload holds only what it sent); returns the body, the same bytes, whole
/// when it fit within the limit.
pub async fn peek<B>(
    mut body: B,
    content_length: Option<u64>,
    limit: usize,
    budget: &Arc<Semaphore>,
) -> Result<Peeked, PeekError>
where
    B: Body<Data = Bytes, Error = ClientFault> + Unpin + Send + 'static,
{
    if content_length.is_some_and(|len| len > limit as u64) {
        return Ok(Peeked::TooLarge(body.map_err(boxed).boxed_unsync()));
    }
    let declared = content_length.map(|len| len as usize);
    let mut peeked = Vec::new();
    let mut charge = Charge::default();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(PeekError::Client)?.into_data() else {
            continue; // request trailers carry nothing llmslo reads
        };
        // The buffer is charged before a byte is copied in; each frame is dropped at once, so
        // no frame pins a larger read buffer of hyper's.
        grow_for(&mut peeked, data.len(), declared);
        charge.up_to(budget, peeked.capacity())?;
        peeked.extend_from_slice(&data);
        if peeked.len() > limit {
            let prefixed = PrefixedBody {
                prefix: Some((Bytes::from(peeked), charge.permit)),
                rest: body,
            };
            return Ok(Peeked::TooLarge(prefixed.boxed_unsync()));
        }
    }
    // Whole: it holds no more than its length while it waits to be sent on (a burst of small
    // bodies of unknown length would otherwise hold their first buffers' worth each).
    peeked.shrink_to_fit();
    charge.down_to(peeked.capacity());
    Ok(Peeked::Whole(Bytes::from(peeked), charge.permit))
}

/// Makes room for `more` bytes: the buffer doubles (from 16 KiB), never past a declared length.
fn grow_for(buffer: &mut Vec<u8>, more: usize, declared: Option<usize>) {
    const FIRST: usize = 16 << 10;
    let needed = buffer.len() + more;
    if needed <= buffer.capacity() {
        return;
    }
    let doubled = needed.max(buffer.capacity() * 2).max(FIRST);
    let target = declared.map_or(doubled, |declared| doubled.min(declared).max(needed));
    buffer.reserve_exact(target - buffer.len());
}

/// The share of the buffer budget one peek holds so far.
#[derive(Default)]
struct Charge {
    permit: Option<OwnedSemaphorePermit>,
}

impl Charge {
    /// Holds `bytes` in all, taking the difference from `budget`; fails at once when it does
    /// not have them.
    fn up_to(&mut self, budget: &Arc<Semaphore>, bytes: usize) -> Result<(), PeekError> {
        let held = self.permit.as_ref().map_or(0, |p| p.num_permits());
        if bytes <= held {
            return Ok(());
        }
        let more = reserve(budget, bytes - held)?;
        match self.permit.as_mut() {
            Some(permit) => permit.merge(more),
            None => self.permit = Some(more),
        }
        Ok(())
    }

    /// Gives back what it holds beyond `bytes`.
    fn down_to(&mut self, bytes: usize) {
        if let Some(permit) = self.permit.as_mut() {
            let excess = permit.num_permits().saturating_sub(bytes);
            drop(permit.split(excess));
        }
    }
}

/// Takes `bytes` from the shared budget, or fails at once when it does not have them.
fn reserve(budget: &Arc<Semaphore>, bytes: usize) -> Result<OwnedSemaphorePermit, PeekError> {
    let bytes = u32::try_from(bytes).map_err(|_| PeekError::BudgetExhausted)?;
    budget
        .clone()
        .try_acquire_many_owned(bytes)
        .map_err(|_| PeekError::BudgetExhausted)
}

/// A body passed on without a look.
pub fn unread<B>(body: B) -> UpstreamBody
where
    B: Body<Data = Bytes, Error = ClientFault> + Send + 'static,
{
    body.map_err(boxed).boxed_unsync()
}

fn boxed(fault: ClientFault) -> BoxError {
    Box::new(fault)
}

/// Already-read bytes (with their budget share, given back once they are sent on) followed
/// by the rest of the client's body.
struct PrefixedBody<B> {
    prefix: Option<(Bytes, Option<OwnedSemaphorePermit>)>,
    rest: B,
}

impl<B: Body<Data = Bytes, Error = ClientFault> + Unpin> Body for PrefixedBody<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some((prefix, _permit)) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx).map_err(boxed)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let prefix = self.prefix.as_ref().map_or(0, |(p, _)| p.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + prefix);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + prefix);
        }
        hint
    }
}

#[cfg(test)]
mod tests;
