//! `llmslo rules` and `llmslo check-config`: the committed example rules never drift from
//! the generator, and bad SLO files are refused with the key named.

use crate::common::llmslo_output as llmslo;
use std::path::Path;

/// `llmslo rules` with `flags` on `config` gives the committed `rules` file, byte for byte.
fn committed_rules_match(flags: &[&str], config: &str, rules: &str) -> String {
    let args: Vec<&str> = ["rules"]
        .into_iter()
        .chain(flags.iter().copied())
        .chain([config])
        .collect();
    let (code, generated, stderr) = llmslo(&args);
    assert_eq!(code, 0, "{stderr}");
    let committed = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rules)).unwrap();
    assert_eq!(
        generated,
        committed,
        "{rules} drifted: run `cargo run -- {} > {rules}`",
        args.join(" ")
    );
    generated
}

#[test]
fn committed_example_rules_match_the_generator() {
    committed_rules_match(&[], "examples/llmslo.yaml", "examples/llmslo.rules.yaml");
}

#[test]
fn committed_tenant_rules_match_the_generator() {
    let generated = committed_rules_match(&[], "tests/rules/tenants.yaml", "tests/rules/tenants.rules.yaml");
    assert!(
        generated.contains("sum by (namespace, model, tenant)") && generated.contains("llmslo:tenant_bad_event_share")
    );
}

#[test]
fn committed_cost_rules_match_the_generator() {
    committed_rules_match(&["--slos-only"], "tests/rules/cost.yaml", "tests/rules/cost.rules.yaml");
}

#[test]
fn committed_second_service_rules_match_the_generator() {
    committed_rules_match(
        &["--slos-only"],
        "tests/rules/search.yaml",
        "tests/rules/search.rules.yaml",
    );
}

#[test]
fn committed_comparison_rules_match_the_generator() {
    let generated = committed_rules_match(
        &["--slos-only", "--compare-by", "version"],
        "tests/rules/compare.yaml",
        "tests/rules/compare.rules.yaml",
    );
    assert!(generated.contains("- name: llmslo-compare-canary"));
    let (code, text, _) = llmslo(&[
        "rules",
        "--compare-by",
        "rollouts_pod_template_hash",
        "--compare-window",
        "30m",
        "tests/rules/compare.yaml",
    ]);
    assert_eq!(code, 0);
    assert!(text.contains("record: llmslo:compare_tpot_seconds:p99_rate30m"));
    assert!(text.contains("sum by (le, namespace, model, rollouts_pod_template_hash)"));
}

#[test]
fn bad_comparison_flags_are_refused_with_the_reason() {
    for (flags, says) in [
        (
            &["--compare-by", "9lives"][..],
            "--compare-by 9lives: not a Prometheus label name",
        ),
        (
            &["--compare-by", "model"][..],
            "--compare-by model: the rules group by that label already",
        ),
        (
            &["--compare-by", "version", "--compare-window", "10s"][..],
            "--compare-window must be between 1m and 1d",
        ),
    ] {
        let args: Vec<&str> = ["rules"]
            .iter()
            .chain(flags)
            .chain(&["tests/rules/compare.yaml"])
            .copied()
            .collect();
        let (code, stdout, stderr) = llmslo(&args);
        assert_eq!(code, 64, "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(stdout.is_empty(), "no half-written rules");
    }
    let (code, _, stderr) = llmslo(&["rules", "--compare-window", "5m", "tests/rules/compare.yaml"]);
    assert_eq!(code, 2, "a window needs a label: {stderr}");
}

#[test]
fn operator_format_and_check_config() {
    let (code, text, _) = llmslo(&["rules", "examples/llmslo.yaml", "--format", "prometheus-operator"]);
    assert_eq!(code, 0);
    assert!(text.contains("kind: PrometheusRule") && text.contains("record: slo:current_burn_rate:ratio"));

    let (code, effective, stderr) = llmslo(&["check-config", "--worker-threads", "1", "examples/llmslo.yaml"]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "upstream: http://127.0.0.1:8000/",
        "engine: auto",
        "min_events: 20",
        "name: tpot-50ms",
        "tpot: 50ms",
        "answer_ttft: 2s",
        "- ttft-500ms",
    ] {
        assert!(effective.contains(line), "missing `{line}` in\n{effective}");
    }
    assert!(
        stderr.contains("worst-case memory with these limits and 1 worker thread: 123 MiB"),
        "{stderr}"
    );
}

#[test]
fn bad_slo_files_exit_64_naming_the_key() {
    let dir = std::env::temp_dir();
    for (name, yaml, key) in [
        (
            "objective",
            "slos:\n  - {name: a, objective: 100.5, ttft: 1s}\n",
            "slos[0].objective",
        ),
        ("kind", "slos:\n  - {name: a, objective: 99}\n", "slos[0].name"),
        (
            "goodput",
            "slos:\n  - {name: a, objective: 99, tpot: 1s}\ngoodput: {require: [b]}\n",
            "goodput.require[0]",
        ),
        ("typo", "slos:\n  - {name: a, objective: 99, tpott: 1s}\n", "tpott"),
    ] {
        let path = dir.join(format!("llmslo-rules-{}-{name}.yaml", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        for command in ["rules", "check-config"] {
            let (code, _, stderr) = llmslo(&[command, path.to_str().unwrap()]);
            assert_eq!(code, 64, "{command} {name}: {stderr}");
            assert!(stderr.contains(key), "{command} {name}: `{key}` not in {stderr}");
        }
        std::fs::remove_file(path).unwrap();
    }
}
