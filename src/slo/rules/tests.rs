//! The rules' text: what each group records and alerts on, and when it is left out.

use super::*;
use crate::slo::spec::SloFile;

fn set() -> SloSet {
    let file: SloFile = serde_yaml::from_str(
        "slos:\n  - {name: tpot-50ms, objective: 99, tpot: 50ms, runbook_url: 'https://runbooks/tpot'}\n  \
         - {name: availability, objective: 99.9, availability: true}\n",
    )
    .unwrap();
    SloSet::validate(Some("chat".into()), None, None, file).unwrap()
}

#[test]
fn an_slo_without_a_runbook_gets_no_empty_runbook_url() {
    let text = render(&set(), RulesFormat::Prometheus, Scope::All);
    assert_eq!(
        text.matches("runbook_url:").count(),
        3,
        "the TPOT SLO's three alerts only"
    );
    assert!(!text.contains("runbook_url: ''") && !text.contains("runbook_url: \"\""));
}

#[test]
fn durations_in_prometheus_form() {
    assert_eq!(prometheus_duration(Duration::from_secs(30 * 86_400)), "30d");
    assert_eq!(prometheus_duration(Duration::from_secs(7200)), "2h");
    assert_eq!(prometheus_duration(Duration::from_secs(90)), "90s");
}

#[test]
fn sloth_names_and_alerts_are_there() {
    let text = render(&set(), RulesFormat::Prometheus, Scope::All);
    for needle in [
        "record: slo:sli_error:ratio_rate5m",
        "record: slo:sli_error:ratio_rate3d",
        "record: slo:sli_error:ratio_rate30d",
        "record: slo:objective:ratio",
        "record: slo:error_budget:ratio",
        "record: slo:current_burn_rate:ratio",
        "record: slo:period_burn_rate:ratio",
        "record: slo:period_error_budget_remaining:ratio",
        "sloth_id: chat-availability",
        "sloth_window: 5m",
        "alert: LLMSLOErrorBudgetBurnFast",
        "alert: LLMSLOErrorBudgetBurnSlow",
        "alert: LLMSLOHighP99TPOT",
        "severity: page",
        "severity: ticket",
        "runbook_url: https://runbooks/tpot",
        "record: llmslo:goodput_requests:rate5m",
        "record: llmslo:gpu_energy_joules_per_output_token:rate5m",
        "record: llmslo:output_tokens_per_gpu_second:rate5m",
    ] {
        assert!(text.contains(needle), "missing {needle}");
    }
    assert_eq!(
        text.matches("alert: LLMSLOHighP99TPOT").count(),
        1,
        "only for the TPOT SLO"
    );
}

#[test]
fn a_low_objective_keeps_only_the_alert_branches_it_can_fire() {
    let set = |objective: &str| {
        let yaml = format!("slos:\n  - {{name: tpot-50ms, objective: {objective}, tpot: 50ms}}\n");
        let file: SloFile = serde_yaml::from_str(&yaml).unwrap();
        SloSet::validate(None, None, None, file).unwrap()
    };
    // 90 %: 14.4x would need 144 % of requests to fail; 6x needs 60 %.
    let ninety = render(&set("90"), RulesFormat::Prometheus, Scope::All);
    assert!(ninety.contains("alert: LLMSLOErrorBudgetBurnFast") && ninety.contains("(6 * 0.1)"));
    assert!(!ninety.contains("(14.4 * 0.1)"), "{ninety}");
    assert!(ninety.contains("# SLO tpot-50ms: the 14.4x page branch (1h and 5m) is left out"));
    // 80 %: no page branch can fire, the tickets can.
    let eighty = render(&set("80"), RulesFormat::Prometheus, Scope::All);
    assert!(!eighty.contains("LLMSLOErrorBudgetBurnFast"));
    assert!(eighty.contains("alert: LLMSLOErrorBudgetBurnSlow"));
    assert_eq!(left_out(&set("80")).len(), 2);
    assert!(left_out(&set("99.9")).is_empty());
}

#[test]
fn counters_are_selected_by_service_and_slo_and_summed_per_namespace_and_model() {
    let text = render(&set(), RulesFormat::Prometheus, Scope::All);
    assert!(text.contains(
        "sum by (namespace, model) (rate(llmslo_slo_bad_events_total{slo_service=\"chat\", slo=\"availability\"}[5m]))"
    ));
    assert!(text.contains(
        "and on(namespace, model) llmslo:slo_events:rate5m{sloth_id=\"chat-availability\", sloth_service=\"chat\", \
         sloth_slo=\"availability\"} * 300 >= 20"
    ));
    assert!(!text.contains("sum(rate("), "nothing merges models or services");
    assert!(text.contains("/ sum by (namespace, slo_service, model) (rate(llmslo_goodput_judged_requests_total[5m]))"));
}

#[test]
fn only_the_five_minute_rates_read_the_pods_counters() {
    let text = render(&set(), RulesFormat::Prometheus, Scope::SlosOnly);
    let raw = |line: &str| line.contains("llmslo_slo_events_total") || line.contains("llmslo_slo_bad_events_total");
    for line in text.lines().filter(|l| raw(l)) {
        assert!(line.contains("[5m]") || line.contains("and on(instance)"), "{line}");
    }
    assert!(text.contains("sum_over_time(llmslo:slo_bad_events:rate5m{"));
    assert!(text.contains("[3d:1h])"), "the longest windows sum hourly rates");
}

#[test]
fn fleet_labels_are_kept_by_every_grouping() {
    let set = set()
        .with_fleet_labels(vec!["cluster".into(), "namespace".into()])
        .unwrap();
    let text = render(&set, RulesFormat::Prometheus, Scope::All);
    for by in text.lines().filter_map(|l| l.split("by (").nth(1)) {
        assert!(
            by.starts_with("cluster, namespace") || by.starts_with("le, cluster, namespace"),
            "{by}"
        );
    }
    assert!(text.contains("and on(cluster, namespace, model)"));
    assert!(text.contains("p99 TPOT of {{ $labels.model }} in {{ $labels.cluster }}/{{ $labels.namespace }}"));
    let refused = |label: &str| set.clone().with_fleet_labels(vec![label.into()]).unwrap_err().1;
    assert!(refused("pod").contains("names one pod"), "{}", refused("pod"));
    assert!(refused("model").contains("for something else"));
    assert!(refused("1x").contains("not a Prometheus label name"));
    let twice = set
        .with_fleet_labels(vec!["cluster".into(), "cluster".into()])
        .unwrap_err();
    assert_eq!(twice.0, "fleet_labels[1]");
}

#[test]
fn slos_only_leaves_out_the_fleet_wide_groups() {
    let all = render(&set(), RulesFormat::Prometheus, Scope::All);
    let slos = render(&set(), RulesFormat::Prometheus, Scope::SlosOnly);
    for fleet in ["llmslo-goodput", "llmslo-capacity", "llmslo-pools", "llmslo-sidecar"] {
        assert!(all.contains(&format!("name: {fleet}\n")) && !slos.contains(&format!("name: {fleet}\n")));
    }
    assert!(slos.contains("alert: LLMSLOErrorBudgetBurnFast"));
}

#[test]
fn operator_format_wraps_the_same_groups() {
    let text = render(&set(), RulesFormat::PrometheusOperator, Scope::All);
    assert!(text.contains("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"));
    assert!(text.contains("name: llmslo-chat"));
    assert!(text.contains("spec:\n  groups:"));
}
