//! The configuration's tests: every key, every error, every precedence.

use super::*;

#[test]
fn mis_indented_keys_are_reported_on_their_own_line() {
    let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
    let head = "upstream: http://127.0.0.1:8000\nslos:\n  - name: tpot\n    objective: 99\n";
    // Deeper: YAML reads it as the rest of `objective`'s value and blames line 4.
    let deeper = error(&format!("{head}      tpot: 50ms\n"));
    assert!(
        deeper.contains("line 5: `tpot:` is indented deeper than `objective:` on line 4"),
        "{deeper}"
    );
    // Shallower, inside the list: the block breaks at line 5.
    let shallower = error(&format!("{head}   tpot: 50ms\n"));
    assert!(
        shallower.contains("line 5: `tpot:` is indented 3 spaces"),
        "{shallower}"
    );
    // At the top level: an SLO key where only top-level keys go.
    let out = error(&format!("{head}tpot: 50ms\n"));
    assert!(out.contains("line 5: `tpot` is a key of an SLO"), "{out}");
    // A top-level key indented into the list.
    let goodput = error(&format!("{head}    tpot: 50ms\n  goodput:\n    require: [tpot]\n"));
    assert!(goodput.contains("line 6: `goodput:` is indented 2 spaces"), "{goodput}");
}

#[test]
fn a_file_that_cannot_be_used_runs_on_flags_with_what_forwarding_needs_from_it() {
    let dir = std::env::temp_dir();
    let overrides = |upstream: Option<&str>| Overrides {
        upstream: upstream.map(str::to_string),
        ..Overrides::default()
    };
    // Missing (an optional ConfigMap that is not there): the flags' upstream.
    let missing = dir.join("llmslo-fail-open-missing.yaml");
    let config = Config::load_fail_open(overrides(Some("http://127.0.0.1:9")), Some(&missing)).unwrap();
    assert_eq!(config.upstream.to_string(), "http://127.0.0.1:9/");
    assert!(config
        .file_error
        .as_deref()
        .unwrap()
        .contains("llmslo-fail-open-missing.yaml"));
    // Invalid SLOs: the file's own upstream and listen are still used, the SLOs are not.
    let invalid = dir.join(format!("llmslo-fail-open-{}.yaml", std::process::id()));
    std::fs::write(
        &invalid,
        "upstream: http://127.0.0.1:7\nlisten: 127.0.0.1:0\nslos:\n  - name: a\n    objective: 150\n    tpot: 50ms\n",
    )
    .unwrap();
    let config = Config::load_fail_open(overrides(None), Some(&invalid)).unwrap();
    assert_eq!(config.upstream.to_string(), "http://127.0.0.1:7/");
    assert_eq!(config.listen.to_string(), "127.0.0.1:0");
    assert!(config.slos.slos.is_empty());
    assert!(config.file_error.is_some());
    assert_eq!(
        config.file.as_deref(),
        Some(invalid.as_path()),
        "still watched for a fix"
    );
    // Nothing to forward to: an error.
    std::fs::write(&invalid, "slos: [\n").unwrap();
    assert!(Config::load_fail_open(overrides(None), Some(&invalid)).is_err());
    std::fs::remove_file(invalid).unwrap();
    // A valid file has no error.
    assert!(Config::load_fail_open(overrides(Some("http://127.0.0.1:9")), None)
        .unwrap()
        .file_error
        .is_none());
}

#[test]
fn yaml_errors_say_what_was_most_likely_meant() {
    let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
    let typo = error("upstream: http://x:1\nmax_modles: 3\n");
    assert!(
        typo.contains("unknown field `max_modles` (did you mean `max_models`?)"),
        "{typo}"
    );
    assert!(typo.contains("line 2"), "{typo}");
    let nested = error("upstream: http://x:1\nslos:\n  - {name: a, objectiv: 99, tpot: 50ms}\n");
    assert!(nested.contains("(did you mean `objective`?)"), "{nested}");
    // Nothing close: no guess.
    let far = error("upstream: http://x:1\nzzz: 3\n");
    assert!(!far.contains("did you mean"), "{far}");
    let bare = error("upstream: http://x:1\nslos:\n  - {name: a, objective: 99, tpot: 50}\n");
    assert!(
        bare.contains("expected a duration with a unit, like `50ms` or `50s`"),
        "{bare}"
    );
    let bare = error("upstream: http://x:1\nupstream_timeout: 50\n");
    assert!(
        bare.contains("like `50ms` or `50s`") && bare.contains("line 2"),
        "{bare}"
    );
}

#[test]
fn engine_metrics_settings_are_checked() {
    let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
    assert_eq!(
        (
            c.engine_metrics,
            c.engine_metrics_path.as_str(),
            c.engine_metrics_interval
        ),
        (EngineMetricsMode::Map, "/metrics", Duration::from_secs(5))
    );
    let c = Config::from_yaml("upstream: http://x:1\nengine_metrics: merge\nengine_metrics_path: /m\n").unwrap();
    assert_eq!(c.engine_metrics, EngineMetricsMode::Merge);
    let bad = Config::from_yaml("upstream: http://x:1\nengine_metrics: sometimes\n")
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("sometimes") && bad.contains("`merge`") && bad.contains("line 2"),
        "{bad}"
    );
    assert_eq!(
        key_of(Config::from_yaml("upstream: http://x:1\nengine_metrics_interval: 0s\n")),
        "engine_metrics_interval"
    );
    assert_eq!(
        key_of(Config::from_yaml(
            "upstream: http://x:1\nengine_metrics_path: metrics\n"
        )),
        "engine_metrics_path"
    );
}

fn key_of(result: Result<Config, ConfigError>) -> String {
    let error = result.unwrap_err();
    error.key().map_or_else(|| error.to_string(), str::to_string)
}

#[test]
fn defaults_apply_to_a_minimal_file() {
    let c = Config::from_yaml("upstream: http://127.0.0.1:8000\n").unwrap();
    assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(c.metrics_listen, "0.0.0.0:9464".parse().unwrap());
    assert_eq!(c.max_peek_bytes, 4 << 20);
    assert_eq!(c.max_body_bytes, 64 << 20);
    assert_eq!(c.max_buffered_request_bytes, 16 << 20);
    assert_eq!(c.request_body_timeout, Duration::from_secs(30));
    assert_eq!(c.send_timeout, Duration::from_secs(60));
    assert_eq!(c.max_connections, 2048);
    assert_eq!(c.max_streams_per_connection, 100);
    assert_eq!(c.max_in_flight_requests, 1024);
    assert_eq!(c.request_body_total_timeout, Duration::from_secs(300));
    assert_eq!(c.stream_idle_timeout, Some(Duration::from_secs(300)));
    assert_eq!(c.upstream_idle_timeout, Duration::from_secs(4));
    assert_eq!(c.max_event_bytes, 1 << 20);
    assert_eq!(c.upstream_timeout, Duration::from_secs(600));
    assert_eq!(c.drain_timeout, Duration::from_secs(30));
    assert_eq!(c.max_models, 16);
    assert_eq!(c.health_path, "/health");
    assert_eq!(c.engine, EngineSetting::Auto);
    assert!(c.inject_usage);
}

#[test]
fn every_key_parses_from_yaml() {
    let c = Config::from_yaml(
        "upstream: http://engine:8000/base\nlisten: 127.0.0.1:1\nmetrics_listen: 127.0.0.1:2\nlog: debug\n\
         log_format: json\nengine: vllm\ninject_usage: false\nmodels: [a, b]\nmax_models: 3\nmax_peek_bytes: 1024\n\
         max_event_bytes: 2048\nupstream_timeout: 2m\ndrain_timeout: 5s\nhealth_path: /ping\n\
         health_interval: 1s\nbuckets:\n  ttft: [0.1, 0.5]\n",
    )
    .unwrap();
    assert_eq!(c.upstream.path(), "/base");
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.engine, EngineSetting::Vllm);
    assert_eq!(c.models, ["a", "b"]);
    assert_eq!(c.upstream_timeout, Duration::from_secs(120));
    assert_eq!(c.buckets.ttft, Some(vec![0.1, 0.5]));
    let limits = Config::from_yaml(
        "upstream: http://x:1\nmax_body_bytes: 100\nmax_buffered_request_bytes: 8388608\n\
         request_body_timeout: 5s\nmax_connections: 7\nstream_idle_timeout: 0s\n",
    )
    .unwrap();
    assert_eq!(limits.max_body_bytes, 100);
    assert_eq!(limits.max_buffered_request_bytes, 8 << 20);
    assert_eq!(limits.request_body_timeout, Duration::from_secs(5));
    assert_eq!(limits.max_connections, 7);
    assert_eq!(limits.stream_idle_timeout, None, "0s turns it off");
    let again = Config::from_yaml(&limits.to_yaml()).unwrap();
    assert_eq!(again.stream_idle_timeout, None);
    assert_eq!(again.max_connections, 7);
}

#[test]
fn flags_and_env_win_over_the_file() {
    let file = FileConfig {
        upstream: Some("http://file:1".into()),
        listen: Some("127.0.0.1:1".into()),
        ..FileConfig::default()
    };
    let flags = Overrides {
        upstream: Some("http://flag:2".into()),
        ..Overrides::default()
    };
    let c = Config::merge(flags, file).unwrap();
    assert_eq!(c.upstream.host(), Some("flag"));
    assert_eq!(c.listen, "127.0.0.1:1".parse().unwrap());
}

#[test]
fn a_bad_value_names_the_flag_or_variable_it_came_from_and_a_bare_port_listens_everywhere() {
    let up = "upstream: http://127.0.0.1:8000\n";
    let file = || parse_yaml(&format!("{up}listen: 127.0.0.1:1\n")).unwrap();
    let flags = Overrides {
        metrics_listen: Some(":18404".into()),
        listen: Some(":8443".into()),
        ..Overrides::default()
    };
    let c = Config::merge(flags, file()).unwrap();
    assert_eq!(c.listen, "0.0.0.0:8443".parse().unwrap());
    assert_eq!(c.metrics_listen, "0.0.0.0:18404".parse().unwrap());
    let bad = |from_env: Vec<&'static str>| {
        let given = Overrides {
            listen: Some("nowhere".into()),
            from_env,
            ..Overrides::default()
        };
        Config::merge(given, file()).unwrap_err().to_string()
    };
    assert_eq!(
        bad(vec![]),
        "flag --listen: `nowhere` is not an address like 0.0.0.0:8080 or :8080"
    );
    assert_eq!(
        bad(vec!["listen"]),
        "environment variable LLMSLO_LISTEN: `nowhere` is not an address like 0.0.0.0:8080 or :8080"
    );
    // The file's own bad value still names its key.
    let error = Config::from_yaml(&format!("{up}listen: nowhere\n"))
        .unwrap_err()
        .to_string();
    assert!(error.contains(":2: config key `listen`: `nowhere`"), "{error}");
}

#[test]
fn bad_values_name_their_key() {
    let up = "upstream: http://127.0.0.1:8000\n";
    assert_eq!(key_of(Config::from_yaml("listen: 1.2.3.4:5\n")), "upstream");
    assert!(Config::from_yaml("upstream: https://x:1\n").is_ok(), "an https engine");
    assert_eq!(key_of(Config::from_yaml("upstream: ftp://x\n")), "upstream");
    assert_eq!(key_of(Config::from_yaml("upstream: /relative\n")), "upstream");
    assert_eq!(key_of(Config::from_yaml(&format!("{up}listen: nowhere\n"))), "listen");
    assert_eq!(key_of(Config::from_yaml(&format!("{up}max_models: 0\n"))), "max_models");
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}max_event_bytes: 10\n"))),
        "max_event_bytes"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}upstream_timeout: 0s\n"))),
        "upstream_timeout"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}upstream_idle_timeout: 0s\n"))),
        "upstream_idle_timeout"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}health_path: health\n"))),
        "health_path"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}max_body_bytes: 0\n"))),
        "max_body_bytes"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}max_buffered_request_bytes: 1024\n"))),
        "max_buffered_request_bytes"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}max_connections: 0\n"))),
        "max_connections"
    );
    for key in ["max_streams_per_connection", "max_in_flight_requests"] {
        assert_eq!(key_of(Config::from_yaml(&format!("{up}{key}: 0\n"))), key);
    }
    assert_eq!(
        key_of(Config::from_yaml(&format!(
            "{up}request_body_timeout: 30s\nrequest_body_total_timeout: 10s\n"
        ))),
        "request_body_total_timeout"
    );
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}request_body_timeout: 0s\n"))),
        "request_body_timeout"
    );
    assert_eq!(key_of(Config::from_yaml(&format!("{up}log: \"llmslo=loud\"\n"))), "log");
    assert_eq!(
        key_of(Config::from_yaml(&format!("{up}buckets: {{tpot: [0.2, 0.1]}}\n"))),
        "buckets.tpot"
    );
}

#[test]
fn slos_are_part_of_the_file_and_their_errors_name_the_key() {
    let c = Config::from_yaml(
        "upstream: http://x:1\nservice: chat\nperiod: 7d\nmin_events: 5\nslos:\n  - {name: tpot, objective: 99, tpot: 50ms}\ngoodput: {require: [tpot]}\n",
    )
    .unwrap();
    assert_eq!(c.slos.service, "chat");
    assert_eq!(c.slos.period, Duration::from_secs(7 * 86_400));
    assert_eq!(c.slos.goodput_require, [0]);
    assert_eq!(
        key_of(Config::from_yaml(
            "upstream: http://x:1\nslos:\n  - {name: t, objective: 200, tpot: 1s}\n"
        )),
        "slos[0].objective"
    );
    let typo = Config::from_yaml("upstream: http://x:1\nslos:\n  - {name: t, objectve: 99, tpot: 1s}\n");
    assert!(typo.unwrap_err().to_string().contains("objectve"));
}

#[test]
fn otel_keys_are_read_checked_and_printed_without_credentials() {
    let c = Config::from_yaml(
        "upstream: http://x:1\notel: {traces_exporter: otlp, exporter_otlp_headers: 'authorization=Bearer s3cret'}\n",
    )
    .unwrap();
    assert_eq!(c.otel.traces_exporter.as_deref(), Some("otlp"));
    let printed = c.to_yaml();
    assert!(printed.contains("traces_exporter: otlp"), "{printed}");
    assert!(!printed.contains("s3cret"), "{printed}");
    assert_eq!(
        key_of(Config::from_yaml(
            "upstream: http://x:1\notel: {traces_exporter: zipkin}\n"
        )),
        "otel.traces_exporter"
    );
    assert!(Config::from_yaml("upstream: http://x:1\notel: {endpoint: x}\n").is_err());
}

#[test]
fn gpu_settings() {
    let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
    assert!(c.gpu.enabled && !c.gpu.processes);
    assert_eq!(c.gpu.interval, Duration::from_secs(1));
    assert_eq!(c.gpu.library_path, "libnvidia-ml.so.1");
    let off =
        Config::from_yaml("upstream: http://x:1\ngpu: {enabled: false, interval: 5s, processes: true}\n").unwrap();
    assert!(!off.gpu.enabled && off.gpu.processes);
    assert_eq!(
        key_of(Config::from_yaml("upstream: http://x:1\ngpu: {interval: 1ms}\n")),
        "gpu.interval"
    );
    let typo = Config::from_yaml("upstream: http://x:1\ngpu: {enable: false}\n")
        .unwrap_err()
        .to_string();
    assert!(typo.contains("enable"), "{typo}");
}

#[test]
fn capacity_window() {
    let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
    assert_eq!(c.capacity_window, Duration::from_secs(30 * 60));
    let c = Config::from_yaml("upstream: http://x:1\ncapacity: {window: 2h}\n").unwrap();
    assert_eq!(c.capacity_window, Duration::from_secs(2 * 3600));
    for bad in [
        "capacity: {window: 10s}",
        "capacity: {window: 2d}",
        "capacity: {window: soon}",
    ] {
        let error = Config::from_yaml(&format!("upstream: http://x:1\n{bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("capacity") || error.contains("window"), "{bad}: {error}");
    }
}

#[test]
fn the_recent_workload_is_off_by_default_and_bounded() {
    let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
    assert_eq!(c.recent_requests, 0);
    let c = Config::from_yaml("upstream: http://x:1\nworkload: {recent_requests: 5000}\n").unwrap();
    assert_eq!(c.recent_requests, 5000);
    assert_eq!(
        c.worst_case_memory_bytes(1)
            - Config::from_yaml("upstream: http://x:1\n")
                .unwrap()
                .worst_case_memory_bytes(1),
        5000 * super::memory::PER_RECENT_REQUEST_BYTES + super::memory::WORKLOAD_PAGES_BYTES
    );
    assert_eq!(
        (
            super::memory::PER_RECENT_REQUEST_BYTES,
            super::memory::WORKLOAD_PAGES_BYTES
        ),
        (192, 256 << 10),
        "as docs/configuration.md says"
    );
    let again = Config::from_yaml(&c.to_yaml()).unwrap();
    assert_eq!(again.recent_requests, 5000);
    let error = Config::from_yaml("upstream: http://x:1\nworkload: {recent_requests: 2000000}\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("workload.recent_requests") && error.contains("at most 1000000"),
        "{error}"
    );
    let error = Config::from_yaml("upstream: http://x:1\nworkload: {recent: 5}\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("recent"), "{error}");
}

#[test]
fn the_effective_config_round_trips() {
    let c = Config::from_yaml(
        "upstream: http://x:1\nengine: tgi\nslos:\n  - {name: a, objective: 99.5, ttft: 500ms}\n  \
         - {name: b, objective: 99.9, availability: true}\ngoodput: {require: [a]}\nbuckets: {ttft: [0.1, 1.0]}\n\
         capacity: {window: 45m}\n",
    )
    .unwrap();
    let again = Config::from_yaml(&c.to_yaml()).unwrap();
    assert_eq!(again.slos, c.slos);
    assert_eq!(again.engine, c.engine);
    assert_eq!(again.buckets, c.buckets);
    assert_eq!(again.upstream_timeout, c.upstream_timeout);
    assert_eq!(again.gpu, c.gpu);
    assert_eq!(again.capacity_window, c.capacity_window);
}

#[test]
fn schema_errors_name_the_key_and_line() {
    let unknown = Config::from_yaml("upstream: http://x:1\nmax_modles: 3\n")
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("max_modles") && unknown.contains("line 2"),
        "{unknown}"
    );
    let wrong_type = Config::from_yaml("upstream: http://x:1\nmax_models: many\n")
        .unwrap_err()
        .to_string();
    assert!(
        wrong_type.contains("max_models") && wrong_type.contains("line 2"),
        "{wrong_type}"
    );
    let duration = Config::from_yaml("upstream: http://x:1\ndrain_timeout: soon\n")
        .unwrap_err()
        .to_string();
    assert!(duration.contains("drain_timeout"), "{duration}");
    let engine = Config::from_yaml("upstream: http://x:1\nengine: triton\n")
        .unwrap_err()
        .to_string();
    assert!(engine.contains("engine") && engine.contains("triton"), "{engine}");
}

#[test]
fn per_request_slos_take_a_mode_separate_by_default() {
    use crate::record::PerRequestSlos;
    let up = "upstream: http://127.0.0.1:8000\n";
    let mode = |line: &str| Config::from_yaml(&format!("{up}{line}")).unwrap().per_request_slos;
    assert_eq!(mode(""), PerRequestSlos::Separate);
    assert_eq!(mode("per_request_slos: separate\n"), PerRequestSlos::Separate);
    assert_eq!(
        mode("per_request_slos: stricter\n"),
        PerRequestSlos::Separate,
        "the older default"
    );
    assert_eq!(mode("per_request_slos: off\n"), PerRequestSlos::Off);
    assert_eq!(mode("per_request_slos: trusted\n"), PerRequestSlos::Trusted);
    assert_eq!(mode("per_request_slos: false\n"), PerRequestSlos::Off);
    assert_eq!(
        mode("per_request_slos: true\n"),
        PerRequestSlos::Separate,
        "never trusted by accident"
    );
    let error = Config::from_yaml(&format!("{up}per_request_slos: always\n"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("per_request_slos") && error.contains("trusted"),
        "{error}"
    );
    assert!(Config::from_yaml(&format!("{up}per_request_slos: trusted\n"))
        .unwrap()
        .to_yaml()
        .contains("per_request_slos: trusted"));
}

#[test]
fn role_and_prefill_relay_are_checked_together() {
    use crate::record::Role;
    let up = "upstream: http://127.0.0.1:8000\n";
    let load = |lines: &str| Config::from_yaml(&format!("{up}{lines}"));
    assert_eq!(load("").unwrap().role, Role::Aggregated);
    let pool = "prefill_pool: [qwen-prefill.llm-d.svc:8000, 10.1.0.0/16:8000]\n";
    let decode = load(&format!("role: decode\nprefill_relay: 127.0.0.1:8299\n{pool}")).unwrap();
    assert_eq!(
        (decode.role, decode.prefill_relay),
        (Role::Decode, Some("127.0.0.1:8299".parse().unwrap()))
    );
    let printed = decode.to_yaml();
    assert!(
        printed.contains("role: decode")
            && printed.contains("prefill_relay: 127.0.0.1:8299")
            && printed.contains("- qwen-prefill.llm-d.svc:8000\n- 10.1.0.0/16:8000"),
        "{printed}"
    );
    for (lines, says) in [
        ("role: leader\n", "prefill"),
        ("prefill_relay: 127.0.0.1:8299\n", "role: decode"),
        ("role: prefill\nprefill_relay: 127.0.0.1:8299\n", "role: decode"),
        ("role: decode\nprefill_relay: 127.0.0.1:8299\n", "needs prefill_pool"),
        (
            "role: decode\nprefill_relay: 0.0.0.0:8299\nprefill_pool: [10.1.2.3:8000]\n",
            "can reach",
        ),
        ("role: decode\nprefill_relay: relay\n", "prefill_relay"),
        (
            "prefill_pool: [10.1.2.3]\n",
            "`prefill_pool`: `10.1.2.3` is not a pod address",
        ),
        (
            "decode_leg_sources: [router]\n",
            "`decode_leg_sources`: `router` is not an address",
        ),
    ] {
        let error = load(lines).unwrap_err().to_string();
        assert!(error.contains(says), "{lines}: {error}");
    }
    let flagged = Config::load(
        Overrides {
            upstream: Some("http://127.0.0.1:8000".into()),
            role: Some(Role::Decode),
            prefill_relay: Some("127.0.0.1:8299".into()),
            prefill_pool: Some("10.1.2.3:8000, 10.1.2.4:8000".into()),
            ..Overrides::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(flagged.role, Role::Decode, "the flag and LLMSLO_ROLE set it too");
    assert_eq!(
        flagged.prefill_pool.len(),
        2,
        "LLMSLO_PREFILL_POOL's members, separated by commas"
    );
    let sources = load("decode_leg_sources: [10.0.3.7, 10.8.0.0/16]\n").unwrap();
    assert_eq!(sources.decode_leg_sources.len(), 2);
}

#[test]
fn an_unknown_key_gets_the_nearest_one_not_every_key() {
    let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
    let typo = error("upstream: http://x:1\nupstrem: 3\n");
    assert!(
        typo.contains("unknown field `upstrem` (did you mean `upstream`?) at line 2"),
        "{typo}"
    );
    assert!(!typo.contains("`listen`"), "no wall of keys: {typo}");
    let far = error("upstream: http://x:1\nzzzzqqq: 3\n");
    assert!(
        far.contains("unknown field `zzzzqqq`: no key llmslo knows is near it (every key is in docs/configuration.md)"),
        "{far}"
    );
    assert!(!far.contains("`listen`"), "{far}");
    // A short list (a section's few keys) is still shown whole.
    let few = error("upstream: http://x:1\ncapacity: {zzzzqqq: 1m}\n");
    assert!(few.contains("`window`"), "{few}");
}

#[test]
fn goodput_require_naming_no_slo_gets_the_nearest_name() {
    let up = "upstream: http://x:1\nslos:\n  - {name: ttft-500ms, objective: 99, ttft: 500ms}\n";
    let error = |require: &str| {
        Config::from_yaml(&format!("{up}goodput: {{require: [{require}]}}\n"))
            .unwrap_err()
            .to_string()
    };
    assert!(error("ttft-50ms").contains("names no SLO: `ttft-50ms` (did you mean `ttft-500ms`?)"));
    assert!(error("latency").contains("names no SLO: `latency`; the SLOs are: ttft-500ms"));
}
