//! The peek: fields read in one pass, bodies bounded in size and time, usage spliced in.

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
