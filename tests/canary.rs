//! The canary analysis examples (an Argo Rollouts AnalysisTemplate, a Flagger MetricTemplate)
//! are the ones the docs show, are well formed, and their queries, over the rules
//! `llmslo rules --compare-by` generates, give the gap they judge (promtool evaluates them).
//! .ci/k8s/validate.sh also validates each against its CRD schema (Argo Rollouts', Flagger's).

use crate::common::{llmslo_output, required_tool};
use serde_yaml::Value;
use std::path::Path;

const ARGO: &str = "examples/canary/argo-analysis-template.yaml";
const FLAGGER: &str = "examples/canary/flagger-metric-template.yaml";

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&read(path)).unwrap()
}

#[test]
fn the_docs_show_the_examples_as_they_are() {
    let docs = read("docs/sweep.md");
    for path in [ARGO, FLAGGER] {
        assert!(docs.contains(&read(path)), "docs/sweep.md should show {path} whole");
    }
}

#[test]
fn the_templates_are_well_formed() {
    let argo = yaml(ARGO);
    assert_eq!(argo["apiVersion"], "argoproj.io/v1alpha1");
    assert_eq!(argo["kind"], "AnalysisTemplate");
    let metrics = argo["spec"]["metrics"].as_sequence().unwrap();
    assert_eq!(metrics.len(), 2);
    let args: Vec<&str> = argo["spec"]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for metric in metrics {
        let query = metric["provider"]["prometheus"]["query"].as_str().unwrap();
        // Every argument a query uses is declared.
        for used in query.split("{{args.").skip(1) {
            let name = used.split("}}").next().unwrap();
            assert!(args.contains(&name), "{name} is not among {args:?}");
        }
        assert!(metric["successCondition"].as_str().unwrap().starts_with("result[0]"));
    }

    let flagger = yaml(FLAGGER);
    assert_eq!(flagger["apiVersion"], "flagger.app/v1beta1");
    assert_eq!(flagger["kind"], "MetricTemplate");
    let spec = flagger["spec"].as_mapping().unwrap();
    let keys: Vec<&str> = spec.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(
        keys,
        ["provider", "query"],
        "a MetricTemplate's spec holds its provider and query"
    );
    assert_eq!(flagger["spec"]["provider"]["type"], "prometheus");
    assert!(flagger["spec"]["provider"]["address"]
        .as_str()
        .unwrap()
        .starts_with("http"));
    let query = flagger["spec"]["query"].as_str().unwrap();
    assert!(query.contains("{{ target }}") && query.contains("{{ target }}-primary"));
}

/// The input series of tests/rules/compare.test.yaml, with the deployments told apart by
/// `label`, named `canary` and `stable`.
fn series(label: &str, canary: &str, stable: &str) -> String {
    let test = read("tests/rules/compare.test.yaml");
    let start = test.find("    input_series:").unwrap();
    let end = test.find("    promql_expr_test:").unwrap();
    test[start..end]
        .replace("version=\"canary\"", &format!("{label}=\"{canary}\""))
        .replace("version=\"stable\"", &format!("{label}=\"{stable}\""))
}

#[test]
#[ignore = "needs promtool (apt-get install prometheus); run with cargo test -- --include-ignored"]
fn the_templates_queries_give_the_gap_they_judge() {
    let Some(promtool) = required_tool("promtool", &[], "apt-get install prometheus") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("llmslo-canary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The same deployments as tests/rules/compare.test.yaml: attainment 0.994 against 0.97, p99
    // TPOT 49.375 ms against 83.3 ms.
    let argo = yaml(ARGO);
    let flagger = yaml(FLAGGER);
    let gap = -0.02400000000000002;
    let ratio = 0.08333333333333322_f64 / 0.049375;
    let argo_query = |i: usize| {
        argo["spec"]["metrics"][i]["provider"]["prometheus"]["query"]
            .as_str()
            .unwrap()
            .replace("{{args.slo}}", "tpot-50ms")
            .replace("{{args.canary-hash}}", "6d4f9c")
            .replace("{{args.stable-hash}}", "58b7d2")
    };
    let flagger_query = flagger["spec"]["query"]
        .as_str()
        .unwrap()
        .replace("{{ target }}", "vllm");
    for (label, canary, stable, checks) in [
        (
            "rollouts_pod_template_hash",
            "6d4f9c",
            "58b7d2",
            vec![(argo_query(0), gap, true), (argo_query(1), ratio, false)],
        ),
        ("app", "vllm", "vllm-primary", vec![(flagger_query, gap, true)]),
    ] {
        let (code, rules, stderr) = llmslo_output(&[
            "rules",
            "--slos-only",
            "--compare-by",
            label,
            "tests/rules/compare.yaml",
        ]);
        assert_eq!(code, 0, "{stderr}");
        std::fs::write(dir.join(format!("{label}.rules.yaml")), rules).unwrap();
        let mut test = format!(
            "rule_files:\n  - {label}.rules.yaml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n{}    promql_expr_test:\n",
            series(label, canary, stable)
        );
        for (query, value, has_slo) in checks {
            let labels = if has_slo {
                "{slo_service=\"canary\", slo=\"tpot-50ms\", model=\"m\"}"
            } else {
                "{model=\"m\"}"
            };
            let indented: String = query.lines().map(|l| format!("          {l}\n")).collect();
            test += &format!(
                "      - expr: |\n{indented}        eval_time: 20m\n        exp_samples:\n          - labels: '{labels}'\n            value: {value:?}\n"
            );
        }
        let file = dir.join(format!("{label}.test.yaml"));
        std::fs::write(&file, test).unwrap();
        let output = std::process::Command::new(&promtool)
            .args(["test", "rules"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{label}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}
