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
mod tests {
    use super::*;
    use http_body_util::channel::Channel;

    const NONE: TenantFields = TenantFields {
        safety_identifier: false,
        user: false,
        metadata_user_id: false,
    };
    const ALL: TenantFields = TenantFields {
        safety_identifier: true,
        user: true,
        metadata_user_id: true,
    };

    /// Starts peeking a body that declares `declared` bytes and sends `sent` of them.
    async fn slow_upload(
        budget: &Arc<Semaphore>,
        declared: u64,
        sent: usize,
    ) -> (
        tokio::task::JoinHandle<Result<Peeked, PeekError>>,
        http_body_util::channel::Sender<Bytes, ClientFault>,
    ) {
        let (mut sender, body) = Channel::<Bytes, ClientFault>::new(1);
        let budget = budget.clone();
        let peek = tokio::spawn(async move { peek(body, Some(declared), 4 << 20, &budget).await });
        sender.send_data(Bytes::from(vec![b' '; sent])).await.unwrap();
        tokio::task::yield_now().await;
        (peek, sender)
    }

    #[tokio::test]
    async fn a_slow_upload_holds_only_the_bytes_it_sent_not_the_length_it_declared() {
        let budget = Arc::new(Semaphore::new(1 << 20));
        // Eight uploads declare 1 MiB each, the whole budget, and send one byte.
        let mut slow = Vec::new();
        for _ in 0..8 {
            slow.push(slow_upload(&budget, 1 << 20, 1).await);
        }
        while budget.available_permits() > (1 << 20) - 8 * (16 << 10) {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            budget.available_permits(),
            (1 << 20) - 8 * (16 << 10),
            "16 KiB each, the first buffer"
        );
        // Another request still fits.
        let body = br#"{"model":"m","stream":true}"#;
        let peeked = peek(
            Full::new(Bytes::from_static(body)).map_err(|never| match never {}),
            Some(body.len() as u64),
            4 << 20,
            &budget,
        )
        .await
        .unwrap();
        assert!(matches!(peeked, Peeked::Whole(ref bytes, _) if &bytes[..] == body));
        drop(slow);
    }

    #[tokio::test]
    async fn an_upload_that_outgrows_the_budget_is_refused_and_gives_its_share_back() {
        let budget = Arc::new(Semaphore::new(256 << 10));
        let (peek, mut sender) = slow_upload(&budget, 1 << 20, 100 << 10).await;
        // 100 KiB sent: the buffer doubled to 128 KiB; 300 KiB more cannot fit.
        let _ = sender.send_data(Bytes::from(vec![b' '; 300 << 10])).await;
        assert_eq!(peek.await.unwrap().err(), Some(PeekError::BudgetExhausted));
        assert_eq!(budget.available_permits(), 256 << 10);
    }

    #[tokio::test]
    async fn a_whole_body_of_unknown_length_holds_only_its_length() {
        let budget = Arc::new(Semaphore::new(1 << 20));
        let (mut sender, body) = Channel::<Bytes, ClientFault>::new(1);
        let peeking = {
            let budget = budget.clone();
            tokio::spawn(async move { peek(body, None, 4 << 20, &budget).await })
        };
        sender
            .send_data(Bytes::from_static(b"{\"model\":\"m\"}"))
            .await
            .unwrap();
        drop(sender);
        let peeked = peeking.await.unwrap().unwrap();
        assert!(matches!(peeked, Peeked::Whole(ref bytes, _) if bytes.len() == 13));
        assert_eq!(
            budget.available_permits(),
            (1 << 20) - 13,
            "not its 16 KiB first buffer"
        );
        drop(peeked);
        assert_eq!(budget.available_permits(), 1 << 20);
    }

    #[tokio::test]
    async fn a_whole_body_holds_its_share_until_it_is_sent_on() {
        let budget = Arc::new(Semaphore::new(1 << 20));
        let (peek, sender) = slow_upload(&budget, 100_000, 100_000).await;
        drop(sender);
        let peeked = peek.await.unwrap().unwrap();
        assert_eq!(
            budget.available_permits(),
            (1 << 20) - 100_000,
            "the declared length caps the buffer"
        );
        drop(peeked);
        assert_eq!(budget.available_permits(), 1 << 20);
    }

    #[test]
    fn reads_only_model_and_stream() {
        let f = parse_fields(
            br#"{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            NONE,
        );
        assert_eq!(f.model.as_deref(), Some("llama"));
        assert_eq!(f.stream, Some(true));
    }

    #[test]
    fn usage_request_is_inserted_keeping_the_clients_bytes() {
        let body = br#"{ "model": "m",  "stream": true, "temperature": 0.70 }"#;
        let rewritten = with_usage_requested(body).unwrap();
        assert_eq!(
            &rewritten[..],
            br#"{"stream_options":{"include_usage":true}, "model": "m",  "stream": true, "temperature": 0.70 }"#
        );
        assert!(parse_fields(&rewritten, NONE).asked_for_usage());
    }

    #[test]
    fn existing_stream_options_are_spliced_never_reserialised() {
        let body = br#"{"seed": 123456789012345678901234567890, "stream": true, "stream_options": {"continuous_usage_stats": true}, "x": 1.50}"#;
        assert_eq!(
            &with_usage_requested(body).unwrap()[..],
            &br#"{"seed": 123456789012345678901234567890, "stream": true, "stream_options": {"include_usage":true,"continuous_usage_stats": true}, "x": 1.50}"#[..]
        );
        for (before, after) in [
            (
                &br#"{"stream_options":{"include_usage":false}}"#[..],
                &br#"{"stream_options":{"include_usage":true}}"#[..],
            ),
            (
                br#"{"stream_options": null, "n": 1e400}"#,
                br#"{"stream_options": {"include_usage":true}, "n": 1e400}"#,
            ),
            (
                br#"{"stream_options":{ }}"#,
                br#"{"stream_options":{"include_usage":true }}"#,
            ),
            (
                br#"{"stream_options":{"include_usage":null,"a":1}}"#,
                br#"{"stream_options":{"include_usage":true,"a":1}}"#,
            ),
            (br#"{}"#, br#"{"stream_options":{"include_usage":true}}"#),
        ] {
            let spliced = with_usage_requested(before).unwrap();
            assert_eq!(&spliced[..], after, "{}", String::from_utf8_lossy(before));
            assert!(parse_fields(&spliced, NONE).asked_for_usage());
        }
        let twice = br#"{"stream_options":{"include_usage":false},"stream_options":{}}"#;
        assert!(with_usage_requested(twice).is_none(), "ambiguous: left as it is");
        let twice_inside = br#"{"stream_options":{"include_usage":false,"include_usage":false}}"#;
        assert!(with_usage_requested(twice_inside).is_none());
    }

    #[test]
    fn existing_stream_options_are_extended() {
        let body = br#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}"#;
        let rewritten: serde_json::Value = serde_json::from_slice(&with_usage_requested(body).unwrap()).unwrap();
        assert_eq!(rewritten["stream_options"]["include_usage"], true);
        assert_eq!(rewritten["stream_options"]["continuous_usage_stats"], false);
        let null = with_usage_requested(br#"{"stream":true,"stream_options":null}"#).unwrap();
        assert!(parse_fields(&null, NONE).asked_for_usage());
        assert!(with_usage_requested(b"[1]").is_none());
        assert!(with_usage_requested(b"{oops").is_none());
    }

    #[test]
    fn tenant_fields_are_read_when_strings_and_never_fail_the_body() {
        let fields = parse_fields(
            br#"{"model":"m","user":"u1","safety_identifier":"s1","metadata":{"user_id":"a1","x":[1]}}"#,
            ALL,
        );
        assert_eq!(fields.model.as_deref(), Some("m"));
        assert_eq!(
            (
                fields.user.as_deref(),
                fields.safety_identifier.as_deref(),
                fields.metadata_user_id.as_deref()
            ),
            (Some("u1"), Some("s1"), Some("a1"))
        );
        let odd = parse_fields(
            br#"{"model":"m","user":7,"safety_identifier":null,"metadata":"x"}"#,
            ALL,
        );
        assert_eq!(
            odd.model.as_deref(),
            Some("m"),
            "an odd tenant field never hides the model"
        );
        assert_eq!(
            (odd.user, odd.safety_identifier, odd.metadata_user_id),
            (None, None, None)
        );
    }

    #[test]
    fn malformed_or_odd_bodies_give_no_fields() {
        for body in [
            &b"{not json"[..],
            b"",
            b"[]",
            br#"{"model":42}"#,
            b"\xff",
            br#"{"model":"a","model":"b"}"#,
            br#"{"model":"m"} trailing"#,
        ] {
            assert_eq!(parse_fields(body, ALL), RequestFields::default(), "{body:?}");
        }
    }

    #[test]
    fn tenant_fields_no_source_reads_are_skipped_unread() {
        let body = br#"{"model":"m","user":"u1","safety_identifier":"s1","metadata":{"user_id":"a1"}}"#;
        let fields = parse_fields(body, NONE);
        assert_eq!(fields.model.as_deref(), Some("m"));
        assert_eq!(
            (fields.user, fields.safety_identifier, fields.metadata_user_id),
            (None, None, None)
        );
        let only_user = TenantFields { user: true, ..NONE };
        let fields = parse_fields(body, only_user);
        assert_eq!(
            (
                fields.user.as_deref(),
                fields.safety_identifier,
                fields.metadata_user_id
            ),
            (Some("u1"), None, None)
        );
    }

    #[test]
    fn long_strings_keep_a_bounded_prefix_that_no_label_allows() {
        let long = "é".repeat(1000);
        let body = format!(r#"{{"model":"{long}","user":"{long}","metadata":{{"user_id":"{long}"}}}}"#);
        let fields = parse_fields(body.as_bytes(), ALL);
        for kept in [fields.model, fields.user, fields.metadata_user_id] {
            let kept = kept.unwrap();
            assert!(kept.len() <= MAX_FIELD_BYTES && kept.len() > 128, "{}", kept.len());
            assert!(long.starts_with(&kept), "cut at a character boundary");
        }
    }

    #[test]
    fn huge_nested_fields_are_skipped_in_bounded_memory() {
        // 4 MiB of dense arrays in every field a tenant may be read from, and in others.
        let dense = format!("[{}0]", "0,".repeat(700_000));
        let body = format!(
            r#"{{"metadata":{{"x":{dense},"user_id":"a1"}},"user":{dense},"safety_identifier":{dense},"tools":{dense},"model":"m","stream":true}}"#
        );
        assert!(body.len() > 5 << 20);
        let fields = parse_fields(body.as_bytes(), ALL);
        assert_eq!(fields.model.as_deref(), Some("m"));
        assert_eq!(fields.stream, Some(true));
        assert_eq!(fields.metadata_user_id.as_deref(), Some("a1"));
        assert_eq!((fields.user, fields.safety_identifier), (None, None));
        // Nested 100,000 deep: skipped without recursion, and the fields around it read.
        let deep = format!(
            r#"{{"model":"m","metadata":{}{},"stream":true}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let fields = parse_fields(deep.as_bytes(), ALL);
        assert_eq!((fields.model.as_deref(), fields.stream), (Some("m"), Some(true)));
    }

    #[test]
    fn the_usage_splice_is_charged_to_the_budget_while_it_copies() {
        let body = Bytes::from_static(br#"{"model":"m","stream":true}"#);
        let budget = Arc::new(Semaphore::new(100));
        let permit = reserve(&budget, body.len()).unwrap();
        let (rewritten, permit) = with_usage_requested_within(body.clone(), Some(permit), &budget).unwrap();
        assert!(parse_fields(&rewritten, NONE).asked_for_usage());
        assert_eq!(
            permit.as_ref().unwrap().num_permits(),
            rewritten.len(),
            "it holds its own length"
        );
        drop(permit);
        assert_eq!(budget.available_permits(), 100);
        // A budget that cannot hold the copy leaves the body as it was, with its share.
        let tight = Arc::new(Semaphore::new(body.len() + 10));
        let permit = reserve(&tight, body.len()).unwrap();
        let (same, permit) = with_usage_requested_within(body.clone(), Some(permit), &tight).unwrap_err();
        assert_eq!(same, body);
        assert_eq!(permit.unwrap().num_permits(), body.len());
        assert_eq!(tight.available_permits(), body.len() + 10);
    }
}
