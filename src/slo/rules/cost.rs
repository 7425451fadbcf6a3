//! What a million tokens cost at each cost SLO, and the alerts when it passes the SLO.

use super::*;

/// The windows the cost SLOs are judged over: the cost must exceed its target over both
/// before a ticket is opened.
const COST_WINDOWS: [&str; 2] = ["1h", "6h"];

/// The cost per million output and input tokens of the service's pods in each namespace over
/// [`COST_WINDOWS`], summed from recorded 5-minute rates of the sidecars' cost and token
/// counters (the pods are told apart by the service on their cost counter), and a ticket per
/// cost SLO when both windows exceed it.
pub(super) fn cost_group(set: &SloSet) -> Group {
    let weight = set.input_token_weight;
    let by = fleet_and(set, []);
    let svc = format!("{{slo_service=\"{}\"}}", set.service);
    let labels = BTreeMap::from([("slo_service".to_string(), set.service.to_string())]);
    let record = |name: &str, expr: String| Rule {
        record: Some(name.into()),
        expr,
        labels: labels.clone(),
        ..Rule::default()
    };
    let mut rules = vec![record(
        "llmslo:cost:rate5m",
        format!("sum by ({by}) (rate(llmslo_cost_total{svc}[5m]))"),
    )];
    for kind in ["output", "input"] {
        rules.push(record(
            &format!("llmslo:{kind}_tokens:rate5m"),
            format!("sum by ({by}) (rate(llmslo_{kind}_tokens_total[5m]) and on(instance) llmslo_cost_total{svc})"),
        ));
    }
    for window in COST_WINDOWS {
        let sum = |name: &str| format!("sum_over_time(llmslo:{name}:rate5m{svc}[{window}])");
        let tokens = format!(
            "(\n    {}\n    + {weight} * {}\n  )",
            sum("output_tokens"),
            sum("input_tokens")
        );
        for (kind, factor) in [
            (CostKind::PerMillionOutputTokens, 1.0),
            (CostKind::PerMillionInputTokens, weight),
        ] {
            rules.push(record(
                &format!("llmslo:{}:ratio_rate{window}", kind.as_str()),
                format!("{factor} * 1e6 * {}\n  / {tokens}", sum("cost")),
            ));
        }
    }
    for slo in &set.cost_slos {
        let name = slo.kind.as_str();
        let target = slo.target;
        let over = |window: &str| format!("llmslo:{name}:ratio_rate{window}{svc} > {target}");
        rules.push(Rule {
            alert: Some("LLMSLOCostOverTarget".into()),
            expr: format!("{}\nand\n{}", over(COST_WINDOWS[0]), over(COST_WINDOWS[1])),
            for_: Some("15m".into()),
            labels: BTreeMap::from([
                ("severity".into(), "ticket".into()),
                ("slo".into(), slo.name.to_string()),
            ]),
            annotations: BTreeMap::from([
                (
                    "summary".into(),
                    format!(
                        "{} cost SLO {}: a million tokens cost more than {target}",
                        set.service, slo.name
                    ),
                ),
                (
                    "description".into(),
                    format!(
                        "{name} has been above {target} over both the last hour and the last 6 hours: \
                         the engine serves fewer tokens for what it costs (idle, or past its knee)."
                    ),
                ),
            ]),
            ..Rule::default()
        });
    }
    Group {
        name: format!("llmslo-cost-{}", set.service),
        rules,
    }
}
