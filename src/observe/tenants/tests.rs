//! Whom requests serve: sources in order, learned and pinned tenants, slots given back.

use super::*;
use std::collections::HashMap;

fn tenants(from: Vec<SourceSetting>, names: &[&str], max: usize) -> Tenants {
    Tenants::new(&TenantSettings {
        from,
        names: names.iter().map(|n| n.to_string()).collect(),
        max_tenants: max,
        ..TenantSettings::default()
    })
    .unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap()))
        .collect()
}

#[test]
fn the_first_source_that_names_a_tenant_wins() {
    let keys = HashMap::from([("team-k".to_string(), vec!["sk-secret".to_string()])]);
    let t = tenants(
        vec![
            SourceSetting::Header("x-llm-d-inference-fairness-id".parse().unwrap()),
            SourceSetting::ApiKeys {
                path: "keys.yaml".into(),
                table: Ok(keys),
            },
            SourceSetting::Body(BodyField::User),
        ],
        &[],
        20,
    );
    let body = BodyIds {
        user: Some("u-body"),
        ..BodyIds::default()
    };
    let both = headers(&[
        ("x-llm-d-inference-fairness-id", "team-h"),
        ("authorization", "Bearer sk-secret"),
    ]);
    assert_eq!(t.label(&both, body), ("team-h".into(), Some(TenantSource::Header)));
    let key = headers(&[("authorization", "Bearer sk-secret")]);
    assert_eq!(t.label(&key, body), ("team-k".into(), Some(TenantSource::ApiKey)));
    let anthropic = headers(&[("x-api-key", "sk-secret")]);
    assert_eq!(t.label(&anthropic, body).0, "team-k");
    let other_key = headers(&[("authorization", "Bearer sk-unknown")]);
    assert_eq!(t.label(&other_key, body), ("u-body".into(), Some(TenantSource::Body)));
    assert_eq!(
        t.label(&HeaderMap::new(), BodyIds::default()),
        (UNKNOWN_TENANT.into(), None)
    );
}

#[test]
fn tenants_are_bounded_and_the_named_ones_pinned() {
    let t = tenants(vec![SourceSetting::Body(BodyField::SafetyIdentifier)], &["vip"], 2);
    let label = |raw: &str| {
        t.label(
            &HeaderMap::new(),
            BodyIds {
                safety_identifier: Some(raw),
                ..BodyIds::default()
            },
        )
        .0
    };
    assert_eq!(label("a"), "a");
    assert_eq!(label("b"), "b");
    assert_eq!(label("c"), OTHER_TENANT, "past the bound");
    assert_eq!(label("vip"), "vip", "pinned whatever came first");
    assert_eq!(label("a"), "a");
    for bad in ["has space", "quote\"", &"x".repeat(65), "unknown", "other", "new\nline"] {
        assert_eq!(label(bad), OTHER_TENANT, "{bad:?}");
    }
    assert_eq!(t.known(), ["vip", UNKNOWN_TENANT]);
    for same in ["a", "vip", "c", "has space"] {
        assert!(
            std::ptr::eq(label(same).as_str(), label(same).as_str()),
            "{same}: shared, never copied"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_learned_slot_is_given_back_after_its_idle_time_and_never_while_in_use() {
    let t = Tenants::new(&TenantSettings {
        from: vec![SourceSetting::Header("x-team".parse().unwrap())],
        names: vec!["vip".into()],
        max_tenants: 2,
        forget_after: Duration::from_secs(60),
        gauges: false,
    })
    .unwrap();
    let label = |raw: &str| t.label(&headers(&[("x-team", raw)]), BodyIds::default()).0;
    let forgotten = std::sync::Mutex::new(Vec::new());
    let forget = || {
        t.forget_idle(Instant::now(), |tenant| {
            forgotten.lock().unwrap().push(tenant.to_string())
        })
    };
    let ended = |tenant: LabelText| {
        let mut record = RequestRecord::new("m".into(), crate::record::Operation::Chat, Duration::ZERO);
        record.tenant = Some(tenant);
        record
    };
    assert_eq!(
        (label("a"), label("b"), label("c")),
        ("a".into(), "b".into(), OTHER_TENANT.into())
    );
    // b's request is labelled now and runs on past b's slot.
    let b_runs = ended(label("b"));
    tokio::time::advance(Duration::from_secs(40)).await;
    assert_eq!(label("a"), "a", "a seen again at 40 s");
    tokio::time::advance(Duration::from_secs(19)).await;
    assert!(forget().is_empty(), "59 s is not idle enough");
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(forget(), ["b"], "b idle 70 s, a 30 s");
    assert_eq!(*forgotten.lock().unwrap(), ["b"]);
    assert_eq!(label("c"), "c", "b's slot is free");
    assert_eq!(label("vip"), "vip");
    // b's request ends now: b takes a slot back past the bound, so the series its record
    // makes are forgotten in their turn, never left behind.
    t.finished(&b_runs);
    assert_eq!(t.learned_now.get(), 3);
    assert_eq!(label("d"), OTHER_TENANT, "no slot while three are held");
    tokio::time::advance(Duration::from_secs(61)).await;
    let mut all = forget();
    all.sort();
    assert_eq!(all, ["a", "b", "c"]);
    assert_eq!(t.forgotten.get(), 4);
    assert_eq!(label("d"), "d");
    t.finished(&ended(label("vip")));
    t.finished(&ended(UNKNOWN_TENANT.into()));
    assert_eq!(t.learned_now.get(), 1, "named and reserved tenants take no slot");
}

#[test]
fn the_keys_never_show() {
    let table = HashMap::from([("team".to_string(), vec!["sk-very-secret".to_string()])]);
    let setting = SourceSetting::ApiKeys {
        path: "/keys.yaml".into(),
        table: Ok(table),
    };
    let t = tenants(vec![setting.clone()], &[], 1);
    for shown in [format!("{setting:?}"), format!("{t:?}")] {
        assert!(!shown.contains("sk-very"), "{shown}");
    }
}

#[test]
fn no_source_is_tenants_off() {
    assert!(Tenants::new(&TenantSettings::default()).is_none());
}
