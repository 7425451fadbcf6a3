//! Prometheus rules from the SLO file, for fleet-wide evaluation from the counters every
//! sidecar exports: Sloth-compatible recording rules (so the public Sloth dashboards work),
//! a traffic-weighted period ratio, multiwindow multi-burn-rate alerts, goodput rules, and a
//! classic p99 TPOT alert.

use super::spec::{Slo, SloKind, SloSet};
use crate::cost::CostKind;
use crate::window::WINDOWS;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

mod cost;
mod fleet;
mod pools;

use cost::cost_group;
use fleet::{capacity_group, goodput_group, gpu_efficiency_group, sidecar_group};

/// How `llmslo rules` wraps its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RulesFormat {
    /// A Prometheus rule file (`rule_files:`).
    Prometheus,
    /// A `monitoring.coreos.com/v1` PrometheusRule for the Prometheus operator.
    PrometheusOperator,
}

/// (short window, long window, burn-rate factor) pairs of the multiwindow multi-burn-rate alerts.
const PAGE: [(&str, &str, f64); 2] = [("5m", "1h", FASTEST_BURN), ("30m", "6h", 6.0)];
/// The fastest page's burn-rate factor.
const FASTEST_BURN: f64 = 14.4;
const TICKET: [(&str, &str, f64); 2] = [("2h", "1d", 3.0), ("6h", "3d", 1.0)];

#[derive(Debug, Serialize)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Serialize)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Default, Serialize)]
struct Rule {
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    alert: Option<String>,
    expr: String,
    #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
    for_: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PrometheusRule {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    spec: RuleFile,
}

#[derive(Debug, Serialize)]
struct Metadata {
    name: String,
    labels: BTreeMap<String, String>,
}

/// Which groups `llmslo rules` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This service's SLO groups and the fleet-wide ones (goodput, capacity, GPU
    /// efficiency, the sidecar's health).
    All,
    /// This service's SLO groups only: for every SLO file after the first, since the fleet-wide
    /// groups are the same for all and belong in Prometheus once.
    SlosOnly,
}

/// Two deployments of one service told apart by a label (`llmslo rules --compare-by`): a
/// version label, or the pod-template hash of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompareBy {
    label: String,
    window: Duration,
}

/// The window of the comparing rules unless given.
pub const DEFAULT_COMPARE_WINDOW: Duration = Duration::from_secs(600);

/// Labels the rules group by already, or that name something else.
const RESERVED_LABELS: [&str; 7] = [
    "model",
    "le",
    "slo",
    "slo_service",
    "instance",
    "tenant",
    "sloth_window",
];

impl CompareBy {
    /// Compares by `label` over `window`; the label must be a Prometheus label name that the
    /// rules do not use already, the window between 1m and 1d.
    pub fn new(label: &str, window: Duration) -> Result<Self, String> {
        let valid = label
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !label.starts_with("__");
        if !valid {
            return Err(format!(
                "--compare-by {label}: not a Prometheus label name (letters, digits and _, not first a digit)"
            ));
        }
        if RESERVED_LABELS.contains(&label) {
            return Err(format!("--compare-by {label}: the rules group by that label already; name the one that tells the deployments apart"));
        }
        if !(Duration::from_secs(60)..=Duration::from_secs(86_400)).contains(&window) {
            return Err("--compare-window must be between 1m and 1d".into());
        }
        Ok(Self {
            label: label.to_string(),
            window,
        })
    }
}

/// The rules for `set` as YAML text.
pub fn render(set: &SloSet, format: RulesFormat, scope: Scope) -> String {
    render_with(set, format, scope, None)
}

/// The rules for `set`, with the rules comparing deployments when asked.
pub fn render_with(set: &SloSet, format: RulesFormat, scope: Scope, compare: Option<&CompareBy>) -> String {
    let mut groups = Vec::new();
    for slo in &set.slos {
        groups.push(sli_group(set, slo));
        groups.push(meta_group(set, slo));
        groups.push(alert_group(set, slo));
    }
    if !set.cost_slos.is_empty() {
        groups.push(cost_group(set));
    }
    if let Some(compare) = compare {
        groups.push(compare_group(set, compare));
    }
    if scope == Scope::All {
        if set.per_tenant {
            groups.push(tenant_group(set));
        }
        groups.push(goodput_group(set));
        groups.push(capacity_group());
        groups.push(pools::pool_group());
        groups.push(gpu_efficiency_group(set));
        groups.push(sidecar_group(set));
    }
    let file = RuleFile { groups };
    let yaml = match format {
        RulesFormat::Prometheus => serde_yaml::to_string(&file),
        RulesFormat::PrometheusOperator => serde_yaml::to_string(&PrometheusRule {
            api_version: "monitoring.coreos.com/v1",
            kind: "PrometheusRule",
            metadata: Metadata {
                name: format!("llmslo-{}", set.service),
                labels: BTreeMap::from([("app.kubernetes.io/name".into(), "llmslo".into())]),
            },
            spec: file,
        }),
    };
    let mut header = format!(
        "# Generated by `llmslo rules` from the SLO file: edit the SLOs, not this file.\n\
         # The {period} window reads {period} of recorded history: keep at least that much retention \
         (Prometheus keeps 15d unless told otherwise).\n",
        period = prometheus_duration(set.period)
    );
    for note in left_out(set) {
        header += &format!("# {note}\n");
    }
    header + &yaml.expect("rule structs always serialize")
}

/// Who burns and who is hurt: each tenant's share of each SLO's bad events, and of the
/// tokens the engines generate (its share of their decode load).
fn tenant_group(set: &SloSet) -> Group {
    let share = |name: &str, counter: &str, by: String| Rule {
        record: Some(name.into()),
        expr: format!(
            "sum by ({by}, tenant) (rate({counter}[5m]))\n  / ignoring(tenant) group_left\n  \
             sum by ({by}) (rate({counter}[5m]))"
        ),
        ..Rule::default()
    };
    Group {
        name: "llmslo-tenants".into(),
        rules: vec![
            share(
                "llmslo:tenant_bad_event_share:ratio_rate5m",
                "llmslo_slo_bad_events_total",
                fleet_and(set, ["slo_service", "slo"]),
            ),
            share(
                "llmslo:tenant_output_token_share:ratio_rate5m",
                "llmslo_output_tokens_total",
                fleet_and(set, []),
            ),
        ],
    }
}

/// Each deployment's attainment per SLO, goodput (as a share of the judged requests and per
/// pod) and p99 TTFT and TPOT over the window, per model: what a canary analysis compares.
fn compare_group(set: &SloSet, compare: &CompareBy) -> Group {
    let (label, window) = (&compare.label, prometheus_duration(compare.window));
    let by = format!("{}, {label}", by(set));
    let mut rules: Vec<Rule> = set
        .slos
        .iter()
        .map(|slo| Rule {
            record: Some(format!("llmslo:compare_slo_attainment:ratio_rate{window}")),
            expr: format!(
                "1 - sum by ({by}) (rate({}[{window}]))\n  / sum by ({by}) (rate({}[{window}]))",
                counter(set, slo, "llmslo_slo_bad_events_total"),
                counter(set, slo, "llmslo_slo_events_total")
            ),
            labels: BTreeMap::from([
                ("slo_service".into(), set.service.to_string()),
                ("slo".into(), slo.name.to_string()),
            ]),
            ..Rule::default()
        })
        .collect();
    let goodput = format!("llmslo_goodput_requests_total{{slo_service=\"{}\"}}", set.service);
    let judged = format!(
        "llmslo_goodput_judged_requests_total{{slo_service=\"{}\"}}",
        set.service
    );
    rules.push(Rule {
        record: Some(format!("llmslo:compare_goodput_attainment:ratio_rate{window}")),
        expr: format!("sum by ({by}) (rate({goodput}[{window}]))\n  / sum by ({by}) (rate({judged}[{window}]))"),
        labels: BTreeMap::from([("slo_service".into(), set.service.to_string())]),
        ..Rule::default()
    });
    rules.push(Rule {
        record: Some(format!("llmslo:compare_goodput_requests_per_pod:rate{window}")),
        expr: format!("avg by ({by}) (sum by ({by}, instance) (rate({goodput}[{window}])))"),
        labels: BTreeMap::from([("slo_service".into(), set.service.to_string())]),
        ..Rule::default()
    });
    for (figure, histogram) in [
        ("ttft", "gen_ai_server_time_to_first_token_seconds_bucket"),
        ("tpot", "gen_ai_server_time_per_output_token_seconds_bucket"),
    ] {
        rules.push(Rule {
            record: Some(format!("llmslo:compare_{figure}_seconds:p99_rate{window}")),
            expr: format!(
                "histogram_quantile(0.99, sum by (le, {}, {label}) (rate({histogram}[{window}])))",
                fleet_and(set, ["model"])
            ),
            ..Rule::default()
        });
    }
    Group {
        name: format!("llmslo-compare-{}", set.service),
        rules,
    }
}

/// A Prometheus duration: `30d`, `12h`, `90m` or `45s`.
pub fn prometheus_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".to_string(),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

fn sloth_labels(set: &SloSet, slo: &Slo) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("sloth_id".into(), sloth_id(set, slo)),
        ("sloth_service".into(), set.service.to_string()),
        ("sloth_slo".into(), slo.name.to_string()),
    ])
}

fn sloth_id(set: &SloSet, slo: &Slo) -> String {
    format!("{}-{}", set.service, slo.name)
}

/// `{sloth_id="…", sloth_service="…", sloth_slo="…"}`.
fn selector(set: &SloSet, slo: &Slo) -> String {
    let pairs: Vec<String> = sloth_labels(set, slo)
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect();
    format!("{{{}}}", pairs.join(", "))
}

fn with(mut labels: BTreeMap<String, String>, key: &str, value: &str) -> BTreeMap<String, String> {
    labels.insert(key.into(), value.into());
    labels
}

/// One SLO's counter, selected by the SLO file's service and the SLO's name: two services
/// with an SLO of the same name never merge.
fn counter(set: &SloSet, slo: &Slo, name: &str) -> String {
    format!("{name}{{slo_service=\"{}\", slo=\"{}\"}}", set.service, slo.name)
}

/// The recorded rates every window of an SLO is built from: the 5-minute rates are the only
/// rules that read the pods' counters; the hourly ones average an hour of them.
const EVENTS_5M: &str = "llmslo:slo_events:rate5m";
const BAD_5M: &str = "llmslo:slo_bad_events:rate5m";
const EVENTS_1H: &str = "llmslo:slo_events:rate1h";
const BAD_1H: &str = "llmslo:slo_bad_events:rate1h";
/// Windows up to this long sum every recorded 5-minute rate in them (2,880 samples for a day at
/// a 30 s evaluation interval); longer ones sum one hourly rate per hour (72 for 3 days, 720
/// for 30).
const LONGEST_FINE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The sum over `window` of a recorded rate (`fine` per 5 minutes, `coarse` per hour) of the
/// SLO `sel` selects. Two such sums divide into the window's traffic-weighted ratio; what a
/// window reads is bounded (a day of evaluations, or an hour of them and one point an hour),
/// never by the pods.
fn window_sum(fine: &str, coarse: &str, sel: &str, window: Duration) -> String {
    let name = prometheus_duration(window);
    if window <= Duration::from_secs(300) {
        format!("{fine}{sel}")
    } else if window <= LONGEST_FINE_WINDOW {
        format!("sum_over_time({fine}{sel}[{name}])")
    } else {
        // Until an hour has passed since the first rate was recorded, no hour is whole: the
        // last hour's rates stand in, so a new deployment's long windows are never empty.
        format!("(sum_over_time({coarse}{sel}[{name}:1h]) or sum_over_time({fine}{sel}[1h]))")
    }
}

/// The SLO's events over the alert window `window`, from the recorded rates (the guards).
fn events_in(set: &SloSet, slo: &Slo, window: &str) -> String {
    let (_, length) = WINDOWS
        .iter()
        .find(|(name, _)| *name == window)
        .expect("alert windows are SLO windows");
    let sel = selector(set, slo);
    if *length <= Duration::from_secs(300) {
        format!("{EVENTS_5M}{sel} * 300")
    } else {
        format!("avg_over_time({EVENTS_5M}{sel}[{window}]) * {}", length.as_secs())
    }
}

fn sli_group(set: &SloSet, slo: &Slo) -> Group {
    let (events, bad) = (
        counter(set, slo, "llmslo_slo_events_total"),
        counter(set, slo, "llmslo_slo_bad_events_total"),
    );
    let labels = sloth_labels(set, slo);
    let sel = selector(set, slo);
    let by = by(set);
    let record = |name: &str, expr: String| Rule {
        record: Some(name.into()),
        expr,
        labels: labels.clone(),
        ..Rule::default()
    };
    // Per model (and tenant, with tenants) in each namespace: the pods of a service that
    // serve several models are judged per model, and each namespace on its own.
    let mut rules = vec![
        record(EVENTS_5M, format!("sum by ({by}) (rate({events}[5m]))")),
        record(BAD_5M, format!("sum by ({by}) (rate({bad}[5m]))")),
        record(EVENTS_1H, format!("avg_over_time({EVENTS_5M}{sel}[1h])")),
        record(BAD_1H, format!("avg_over_time({BAD_5M}{sel}[1h])")),
    ];
    // Each window's ratio weighs its tiles by their traffic: idle tiles add nothing (where an
    // average of ratios would take their NaNs), and rate() absorbs sidecar restarts.
    let windows = WINDOWS
        .iter()
        .map(|(name, length)| (name.to_string(), *length))
        .chain([(prometheus_duration(set.period), set.period)]);
    for (name, length) in windows {
        let bad_sum = window_sum(BAD_5M, BAD_1H, &sel, length);
        let events_sum = window_sum(EVENTS_5M, EVENTS_1H, &sel, length);
        rules.push(Rule {
            record: Some(format!("slo:sli_error:ratio_rate{name}")),
            expr: format!("{bad_sum}\n  / {events_sum}"),
            labels: with(labels.clone(), "sloth_window", &name),
            ..Rule::default()
        });
    }
    Group {
        name: format!("llmslo-sli-recordings-{}", sloth_id(set, slo)),
        rules,
    }
}

fn meta_group(set: &SloSet, slo: &Slo) -> Group {
    let labels = sloth_labels(set, slo);
    let sel = selector(set, slo);
    let period = prometheus_duration(set.period);
    let on = "on(sloth_id, sloth_slo, sloth_service) group_left";
    let record = |name: &str, expr: String| Rule {
        record: Some(name.into()),
        expr,
        labels: labels.clone(),
        ..Rule::default()
    };
    let mut info = record("sloth_slo_info", "vector(1)".into());
    info.labels
        .insert("sloth_objective".into(), format!("{}", slo.objective_percent()));
    info.labels.insert("sloth_mode".into(), "cli-gen-prom".into());
    info.labels.insert("sloth_spec".into(), "prometheus/v1".into());
    info.labels
        .insert("sloth_version".into(), format!("llmslo-{}", env!("CARGO_PKG_VERSION")));
    Group {
        name: format!("llmslo-meta-recordings-{}", sloth_id(set, slo)),
        rules: vec![
            record("slo:objective:ratio", format!("vector({})", slo.objective)),
            record("slo:error_budget:ratio", format!("vector({})", slo.error_budget())),
            record(
                "slo:time_period:days",
                format!("vector({})", set.period.as_secs_f64() / 86_400.0),
            ),
            record(
                "slo:current_burn_rate:ratio",
                format!("slo:sli_error:ratio_rate5m{sel}\n  / {on} slo:error_budget:ratio{sel}"),
            ),
            record(
                "slo:period_burn_rate:ratio",
                format!("slo:sli_error:ratio_rate{period}{sel}\n  / {on} slo:error_budget:ratio{sel}"),
            ),
            record(
                "slo:period_error_budget_remaining:ratio",
                format!("1 - slo:period_burn_rate:ratio{sel}"),
            ),
            info,
        ],
    }
}

/// What an SLO promises, in words for alert descriptions.
fn promise(slo: &Slo) -> String {
    let pct = slo.objective_percent();
    let ms = |d: Duration| format!("{} ms", d.as_secs_f64() * 1e3);
    let allowance = if slo.prompt.per_1k_prompt_tokens.is_zero() {
        String::new()
    } else {
        format!(" plus {} per 1000 prompt tokens", ms(slo.prompt.per_1k_prompt_tokens))
    };
    let scope = slo
        .prompt
        .max_prompt_tokens
        .map_or(String::new(), |max| format!(" (prompts of at most {max} tokens)"));
    match slo.kind {
        SloKind::Ttft(d) => format!(
            "{pct}% of successful streamed requests{scope} have TTFT <= {}{allowance}",
            ms(d)
        ),
        SloKind::AnswerTtft(d) => format!(
            "{pct}% of successful streamed requests{scope} have their first answer token (after reasoning) \
             within {}{allowance}",
            ms(d)
        ),
        SloKind::Tpot(d) => format!("{pct}% of successful streamed requests have TPOT <= {}", ms(d)),
        SloKind::E2e(d) => format!("{pct}% of successful requests complete within {}", ms(d)),
        SloKind::Availability => format!("{pct}% of requests are answered without an engine error"),
    }
}

/// The labels an SLO's ratios keep: the fleet labels, `model`, and `tenant` when SLOs are
/// judged per tenant.
fn by(set: &SloSet) -> String {
    let tenant = set.per_tenant.then_some("tenant");
    fleet_and(set, ["model"].into_iter().chain(tenant))
}

/// The fleet labels followed by `more`, comma-separated.
fn fleet_and<'a>(set: &'a SloSet, more: impl IntoIterator<Item = &'a str>) -> String {
    let labels: Vec<&str> = set.fleet_labels.iter().map(|l| l.as_str()).chain(more).collect();
    labels.join(", ")
}

/// The samples of the pods that serve `set`'s service (those exporting its SLO counters), for
/// series that carry no service of their own: `<series> and on(instance) <this>`.
fn service_pods(set: &SloSet) -> String {
    format!("llmslo_slo_events_total{{slo_service=\"{}\"}}", set.service)
}

fn burn_expr(set: &SloSet, slo: &Slo, pairs: &[(&str, &str, f64)]) -> String {
    let sel = selector(set, slo);
    let budget = slo.error_budget();
    let branches: Vec<String> = pairs
        .iter()
        .map(|(short, long, factor)| {
            format!(
                "(\n  max(slo:sli_error:ratio_rate{short}{sel} > ({factor} * {budget})) without (sloth_window)\n  \
                 and\n  max(slo:sli_error:ratio_rate{long}{sel} > ({factor} * {budget})) without (sloth_window)\n  \
                 and on({by}) {events} >= {min}\n)",
                events = events_in(set, slo, short),
                min = set.min_events,
                by = by(set)
            )
        })
        .collect();
    branches.join("\nor\n")
}

/// Whether a burn-rate factor can ever be reached: a burn of `factor` needs `factor` × the
/// error budget of requests to fail, which a low objective can put above 100 %.
fn can_fire(slo: &Slo, factor: f64) -> bool {
    factor * slo.error_budget() < 1.0
}

/// The alert branches left out of the rules because their objective could never let them
/// fire, one line each (printed by `llmslo rules` and `check-config`, and in the rule file).
pub fn left_out(set: &SloSet) -> Vec<String> {
    let mut notes = Vec::new();
    for slo in &set.slos {
        for (severity, pairs) in [("page", &PAGE), ("ticket", &TICKET)] {
            for (short, long, factor) in pairs.iter().filter(|(_, _, factor)| !can_fire(slo, *factor)) {
                notes.push(format!(
                    "SLO {}: the {factor}x {severity} branch ({long} and {short}) is left out: at objective {} \
                     it would need {:.0} % of requests to fail",
                    slo.name,
                    slo.objective_percent(),
                    factor * slo.error_budget() * 100.0
                ));
            }
        }
    }
    notes
}

fn alert_group(set: &SloSet, slo: &Slo) -> Group {
    let alert = |name: &str, severity: &str, pairs: &[(&str, &str, f64)], speed: &str| {
        let windows: Vec<String> = pairs
            .iter()
            .map(|(short, long, factor)| format!("{factor}x over {long} and {short}"))
            .collect();
        Rule {
            alert: Some(name.into()),
            expr: burn_expr(set, slo, pairs),
            labels: with(with(sloth_labels(set, slo), "severity", severity), "slo", &slo.name),
            annotations: BTreeMap::from([
                (
                    "summary".into(),
                    format!("{} SLO {}: error budget burning {speed}", set.service, slo.name),
                ),
                (
                    "description".into(),
                    format!(
                        "SLO {}: {}. Its error budget is burning at {} (at least {} events in the short window).",
                        slo.name,
                        promise(slo),
                        windows.join(", or "),
                        set.min_events
                    ),
                ),
                ("slo".into(), slo.name.to_string()),
            ])
            .into_iter()
            .chain(runbook(slo))
            .collect(),
            ..Rule::default()
        }
    };
    // Only the branches the objective lets fire; an alert with none is left out.
    let firing = |pairs: &[(&'static str, &'static str, f64)]| -> Vec<(&'static str, &'static str, f64)> {
        pairs
            .iter()
            .copied()
            .filter(|(_, _, factor)| can_fire(slo, *factor))
            .collect()
    };
    let (page, ticket) = (firing(&PAGE), firing(&TICKET));
    let mut rules = Vec::new();
    if !page.is_empty() {
        rules.push(alert("LLMSLOErrorBudgetBurnFast", "page", &page, "fast"));
    }
    if !ticket.is_empty() {
        rules.push(alert("LLMSLOErrorBudgetBurnSlow", "ticket", &ticket, "slowly"));
    }
    if let SloKind::Tpot(threshold) = slo.kind {
        let (by, pods) = (fleet_and(set, ["model"]), service_pods(set));
        let place: Vec<String> = set
            .fleet_labels
            .iter()
            .map(|l| format!("{{{{ $labels.{l} }}}}"))
            .collect();
        let place = if place.is_empty() {
            String::new()
        } else {
            format!(" in {}", place.join("/"))
        };
        rules.push(Rule {
            alert: Some("LLMSLOHighP99TPOT".into()),
            // Native histograms where Prometheus has them, the classic buckets otherwise; the
            // service's pods only.
            expr: format!(
                "(\n  histogram_quantile(0.99, sum by ({by}) (rate(gen_ai_server_time_per_output_token_seconds[5m]) and on(instance) {pods}))\n  \
                 or\n  histogram_quantile(0.99, sum by (le, {by}) (rate(gen_ai_server_time_per_output_token_seconds_bucket[5m]) and on(instance) {pods}))\n\
                 ) > {}",
                threshold.as_secs_f64()
            ),
            for_: Some("10m".into()),
            labels: BTreeMap::from([
                ("severity".into(), "ticket".into()),
                ("slo".into(), slo.name.to_string()),
                ("slo_service".into(), set.service.to_string()),
            ]),
            annotations: BTreeMap::from([
                (
                    "summary".into(),
                    format!(
                        "{}: p99 TPOT of {{{{ $labels.model }}}}{place} is above {} ms",
                        set.service,
                        threshold.as_secs_f64() * 1e3
                    ),
                ),
                (
                    "description".into(),
                    "histogram_quantile interpolates inside a bucket (within 4.4 % on native histograms; the \
                     threshold is an exact classic bucket edge), but prefer the burn-rate alerts for paging."
                        .into(),
                ),
                ("slo".into(), slo.name.to_string()),
            ])
            .into_iter()
            .chain(runbook(slo))
            .collect(),
            ..Rule::default()
        });
    }
    Group {
        name: format!("llmslo-alerts-{}", sloth_id(set, slo)),
        rules,
    }
}

/// The `runbook_url` annotation, when the SLO names a runbook (an empty one is left out).
fn runbook(slo: &Slo) -> Option<(String, String)> {
    (!slo.runbook_url.trim().is_empty()).then(|| ("runbook_url".into(), slo.runbook_url.clone()))
}

/// A recording rule.
fn record(name: &str, expr: &str) -> Rule {
    Rule {
        record: Some(name.into()),
        expr: expr.into(),
        ..Rule::default()
    }
}

#[cfg(test)]
mod tests;
