//! The demo's live table: counts and token rates from `/metrics`, each API's and model's
//! exact percentiles, the causes of bad events, and each SLO's attainment, burn rate and
//! budget, fitted to the terminal's width.

use super::exact::{exact_quantile, Exact};
use super::{APIS, MODELS, REASONING_TOKENS};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Output-token totals and the time of the previous print, for the tokens/s column.
pub(super) struct Previous {
    pub(super) tokens: BTreeMap<String, f64>,
    pub(super) at: tokio::time::Instant,
}

/// Outcomes that count against the engine (not the client's own doing).
const ENGINE_ERRORS: [&str; 3] = ["upstream_error", "timeout", "connect_error"];

/// The table for one scrape: counts and token rates from `/metrics`, percentiles exact from
/// the sidecar's records in `exact`.
pub(super) fn render_table(text: &str, previous: &mut Previous, exact: &Exact) -> String {
    let exposition = Exposition::parse(text);
    let elapsed = std::mem::replace(&mut previous.at, tokio::time::Instant::now()).elapsed();
    let mut out = format!(
        "{:<16} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}\n",
        "model", "requests", "errors", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tok/s/user", "tokens/s"
    );
    for model in MODELS {
        let of_model = [("model", model)];
        let requests = exposition.sum("llmslo_requests_total", &of_model);
        let errors: f64 = ENGINE_ERRORS
            .iter()
            .map(|outcome| exposition.sum("llmslo_requests_total", &[("model", model), ("outcome", outcome)]))
            .sum();
        let tokens = exposition.sum("llmslo_output_tokens_total", &of_model);
        let before = previous.tokens.insert(model.to_string(), tokens).unwrap_or(0.0);
        let rate = (tokens - before) / elapsed.as_secs_f64().max(1e-3);
        let [ttft, tpot] = match exact.by_model.get(model) {
            Some([ttft, tpot]) => [Some(ttft), Some(tpot)],
            None => [None, None],
        };
        let per_user = per_user_speed(tpot).map_or("-".to_string(), |v| format!("{v:.1}"));
        out += &format!(
            "{model:<16} {requests:>8} {errors:>8} {:>9} {:>9} {:>9} {:>9} {per_user:>10} {rate:>10.1}\n",
            ms(exact_quantile(ttft, 0.5)),
            ms(exact_quantile(ttft, 0.99)),
            ms(exact_quantile(tpot, 0.5)),
            ms(exact_quantile(tpot, 0.99)),
        );
    }
    out += "(requests and errors since the start, the rest since the last view; errors are upstream_error,\n \
            timeout and connect_error; percentiles are exact, the nearest rank of the sidecar's own per-request\n \
            figures, where histogram_quantile would interpolate inside a bucket; tok/s/user: mean of 1 / TPOT)\n";
    if exact.lost > 0 {
        out += &format!(
            "({} requests finished while the view was too far behind to read them)\n",
            exact.lost
        );
    }
    out + "\n"
}

/// Milliseconds, or `-` when there is no figure.
fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".to_string(), |s| format!("{:.1}ms", s * 1e3))
}

/// The streaming speed one user sees: the mean of 1 / TPOT, as `llmslo sweep` reports it.
fn per_user_speed(tpot: Option<&VecDeque<f64>>) -> Option<f64> {
    let speeds: Vec<f64> = tpot?.iter().filter(|t| **t > 0.0).map(|t| 1.0 / t).collect();
    (!speeds.is_empty()).then(|| speeds.iter().sum::<f64>() / speeds.len() as f64)
}

/// Per API: requests since the start, and, over the requests since the last view, the median
/// wait for the first token beside the median wait for the first token of the answer (after the
/// reasoning), exact.
pub(super) fn render_apis(text: &str, exact: &Exact) -> String {
    let exposition = Exposition::parse(text);
    let mut out = format!(
        "{:<16} {:>8} {:>9} {:>12}\n",
        "API", "requests", "TTFT p50", "answer p50"
    );
    for (_, operation) in APIS {
        let [ttft, answer] = match exact.by_api.get(operation) {
            Some([ttft, answer]) => [Some(ttft), Some(answer)],
            None => [None, None],
        };
        out += &format!(
            "{operation:<16} {:>8} {:>9} {:>12}\n",
            exposition.sum("llmslo_requests_total", &[("operation", operation)]),
            ms(exact_quantile(ttft, 0.5)),
            ms(exact_quantile(answer, 0.5)),
        );
    }
    out + &format!(
        "(the engine reasons for {REASONING_TOKENS} tokens before each answer: the answer's first token comes later)\n\n"
    )
}

/// Each SLO's state per model: good events over the last 5 minutes, burn rate over 5m and 1h,
/// error budget left; then goodput.
///
/// The budget column is the share of the whole period's error budget spent so far: the
/// sidecar's budget-remaining gauge judges the budget over the uptime (a young process that
/// saw 5 bad requests in 10 s reads -3700 %), which is right for alerting and unreadable here.
/// `period_share` is the uptime over the period.
/// Why each SLO burned so far (every bad event's cause, all models), and the engine's own
/// queue and batch as its `/metrics` states them.
pub(super) fn render_causes(text: &str) -> String {
    let exposition = Exposition::parse(text);
    let mut by_slo: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
    for (name, labels, value) in &exposition.samples {
        if *name != "llmslo_slo_bad_events_by_cause_total" {
            continue;
        }
        if let (Some(slo), Some(cause)) = (Exposition::label(labels, "slo"), Exposition::label(labels, "cause")) {
            *by_slo.entry(slo).or_default().entry(cause).or_default() += value;
        }
    }
    let mut out = String::new();
    for (slo, causes) in by_slo {
        let total: f64 = causes.values().sum();
        let mut shares: Vec<(&str, f64)> = causes.into_iter().filter(|(_, n)| *n > 0.0).collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shares: Vec<String> = shares
            .iter()
            .map(|(cause, n)| format!("{cause} {:.0}%", n / total * 100.0))
            .collect();
        out += &format!("why {slo:<12} {total:.0} bad events: {}\n", shares.join(", "));
    }
    let gauge = |name: &str| {
        exposition
            .gauge(name, &[], None)
            .map_or("-".to_string(), |v| format!("{v:.0}"))
    };
    out += &format!(
        "engine           {} waiting, {} running (its own /metrics)\n",
        gauge("llmslo_engine_requests_waiting"),
        gauge("llmslo_engine_requests_running"),
    );
    out
}

/// The SLOs' burn and budget, goodput, and the capacity estimate, which says while it waits for
/// `capacity_needs` served requests to see the SLOs' tail.
pub(super) fn render_slos(text: &str, period_share: f64, capacity_needs: u64) -> String {
    let exposition = Exposition::parse(text);
    let mut slos: Vec<&str> = exposition
        .samples
        .iter()
        .filter(|(n, _, _)| *n == "llmslo_slo_error_budget_remaining_ratio")
        .filter_map(|(_, labels, _)| Exposition::label(labels, "slo"))
        .collect();
    slos.dedup();
    let pct = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0))
    };
    // A young process spends hundredths of a percent of a month's budget.
    let small_pct = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{:.3}%", v * 100.0))
    };
    let num = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{v:.2}"))
    };
    let mut out = format!(
        "{:<16} {:<16} {:>9} {:>8} {:>8} {:>12}\n",
        "SLO", "model", "good 5m", "burn 5m", "burn 1h", "budget spent"
    );
    for slo in slos {
        for model in MODELS {
            let gauge =
                |name: &str, window: Option<&str>| exposition.gauge(name, &[("slo", slo), ("model", model)], window);
            out += &format!(
                "{slo:<16} {model:<16} {:>9} {:>8} {:>8} {:>12}\n",
                pct(gauge("llmslo_slo_error_ratio", Some("5m")).map(|r| 1.0 - r)),
                num(gauge("llmslo_slo_burn_rate", Some("5m"))),
                num(gauge("llmslo_slo_burn_rate", Some("1h"))),
                small_pct(
                    gauge("llmslo_slo_error_budget_remaining_ratio", None).map(|left| (1.0 - left) * period_share)
                ),
            );
        }
    }
    for model in MODELS {
        let gauge = |name: &str| exposition.gauge(name, &[("model", model)], Some("5m"));
        out += &format!(
            "goodput {model:<16} {} requests/s, {} tokens/s, {} of valid requests meet every goodput SLO\n",
            num(gauge("llmslo_goodput_requests_per_second")),
            num(gauge("llmslo_goodput_output_tokens_per_second")),
            pct(gauge("llmslo_slo_attainment_ratio")),
        );
    }
    let gauge = |name: &str| exposition.gauge(name, &[], None);
    let per_slo: Vec<String> = exposition
        .samples
        .iter()
        .filter(|(name, _, _)| *name == "llmslo_capacity_requests_per_second")
        .filter_map(|(_, labels, c)| Some(format!("{} {}", Exposition::label(labels, "slo")?, num(Some(*c)))))
        .collect();
    let knee = gauge("llmslo_capacity_knee_requests_per_second");
    let served = exposition.sum("llmslo_requests_total", &[("outcome", "success")]);
    let waiting = if knee.is_some_and(f64::is_finite) || served >= capacity_needs as f64 {
        String::new()
    } else {
        format!(" (it needs {capacity_needs} served requests to see the SLOs' tail: {served:.0} so far)")
    };
    out += &format!(
        "capacity engine  knee {} requests/s{waiting} at {} in flight ({}), load {} requests/s, saturation {}\n",
        num(knee),
        num(gauge("llmslo_capacity_knee_concurrency")),
        per_slo.join(", "),
        num(gauge("llmslo_capacity_load_requests_per_second")),
        pct(gauge("llmslo_slo_saturation_ratio")),
    );
    out + "(\"-\": fewer than min_events requests in the window yet, or for capacity too little spread in load; \
           burn rate 1 spends the budget in exactly its period; budget spent: of the whole period's, so far)\n\n"
}

/// The widest the view is drawn: it fits a 120-column terminal.
pub(super) const WIDTH: usize = 120;

/// `text` with every line longer than `width` broken at its last space that fits, the rest
/// indented by four.
pub(super) fn fit_width(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (mut rest, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let mut indent = "";
        while indent.len() + rest.chars().count() > width {
            // Up to and with the first character past the width: a space there still fits.
            let fits = rest
                .char_indices()
                .nth(width - indent.len())
                .map_or(rest.len(), |(i, c)| i + c.len_utf8());
            let Some(cut) = rest[..fits].rfind(' ').filter(|&cut| cut > 0) else {
                break;
            };
            out.push_str(indent);
            out.push_str(rest[..cut].trim_end());
            out.push('\n');
            rest = rest[cut..].trim_start();
            indent = "    ";
        }
        out.push_str(indent);
        out.push_str(rest);
        out.push_str(newline);
    }
    out
}

/// How much of the SLO period `uptime` is (at most all of it).
pub(super) fn share_of(uptime: Duration, period: Duration) -> f64 {
    uptime.min(period).as_secs_f64() / period.as_secs_f64()
}

/// A minimal reading of the text exposition: sample name, labels, value.
struct Exposition<'a> {
    samples: Vec<(&'a str, &'a str, f64)>,
}

impl<'a> Exposition<'a> {
    fn parse(text: &'a str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (name, labels) = series.split_once('{').unwrap_or((series, ""));
                Some((name, labels, value.parse().ok()?))
            })
            .collect();
        Self { samples }
    }

    /// The value of label `key` (a whole name: `slo` is not `slo_service`).
    fn label<'s>(labels: &'s str, key: &str) -> Option<&'s str> {
        let pattern = format!("{key}=\"");
        let at = labels
            .match_indices(&pattern)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || labels.as_bytes()[i - 1] == b',')?;
        let start = at + pattern.len();
        let end = labels[start..].find('"')? + start;
        Some(&labels[start..end])
    }

    /// The value of the gauge `name` whose labels include `labels` (and `window`, when given).
    fn gauge(&self, name: &str, labels: &[(&str, &str)], window: Option<&str>) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                *n == name
                    && labels.iter().all(|(k, v)| Self::label(l, k) == Some(v))
                    && window.is_none_or(|w| Self::label(l, "window") == Some(w))
            })
            .map(|(_, _, v)| *v)
    }

    /// Whether `labels` include every one of `wanted`.
    fn matches(labels: &str, wanted: &[(&str, &str)]) -> bool {
        wanted.iter().all(|(k, v)| Self::label(labels, k) == Some(v))
    }

    /// The sum of every sample of `name` whose labels include `wanted`.
    fn sum(&self, name: &str, wanted: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| *n == name && Self::matches(labels, wanted))
            .map(|(_, _, v)| v)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantile::nearest_rank;
    use crate::record::RequestRecord;

    #[test]
    fn long_lines_are_broken_at_a_space_to_fit_the_width() {
        let text = "short\nfirst second third fourth fifth\nunbreakable-long-word\n";
        assert_eq!(
            fit_width(text, 16),
            "short\nfirst second\n    third fourth\n    fifth\nunbreakable-long-word\n"
        );
        assert_eq!(fit_width("no newline at the end", 100), "no newline at the end");
    }

    fn record(model: &str, operation: crate::record::Operation, ttft_ms: f64, tpot_ms: f64) -> RequestRecord {
        RequestRecord {
            ttft: Some(Duration::from_secs_f64(ttft_ms / 1e3)),
            answer_ttft: Some(Duration::from_secs_f64(2.0 * ttft_ms / 1e3)),
            tpot_per_choice: vec![Duration::from_secs_f64(tpot_ms / 1e3)],
            output_tokens: Some(32),
            input_tokens: Some(8),
            token_events: 32,
            ..RequestRecord::new(model.into(), operation, Duration::from_secs(1))
        }
    }

    /// The TTFT p50, TTFT p99, TPOT p50 and TPOT p99 cells of `model`'s row, in ms.
    fn cells(table: &str, model: &str) -> Vec<f64> {
        let row = table.lines().find(|l| l.starts_with(model)).unwrap();
        row.split_whitespace()
            .filter_map(|c| c.strip_suffix("ms"))
            .map(|c| c.parse().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn the_tables_percentiles_are_the_exact_ones() {
        use crate::record::Operation;
        let mut exact = Exact::default();
        // A constant 30 ms TPOT (which classic buckets read as 49.75 ms at p99) for one model,
        // a long-tailed one (median 30 ms, p99 near 80 ms) for the other.
        let tailed: Vec<f64> = (0..1000)
            .map(|i| 30.0 * (f64::from(i) / 1000.0 * 2.7).exp().powf(0.37))
            .collect();
        for (i, tpot) in tailed.iter().enumerate() {
            exact.add(&record(MODELS[0], Operation::Chat, 200.0, 30.0));
            exact.add(&record(MODELS[1], Operation::Responses, 100.0 + i as f64 / 10.0, *tpot));
        }
        let mut previous = Previous {
            tokens: BTreeMap::new(),
            at: tokio::time::Instant::now(),
        };
        let table = render_table("", &mut previous, &exact);
        assert_eq!(cells(&table, MODELS[0]), [200.0, 200.0, 30.0, 30.0], "{table}");
        let mut sorted = tailed.clone();
        sorted.sort_by(f64::total_cmp);
        let want = [
            100.0 + 499.0 / 10.0,
            100.0 + 989.0 / 10.0,
            nearest_rank(&sorted, 0.5),
            nearest_rank(&sorted, 0.99),
        ];
        for (got, want) in cells(&table, MODELS[1]).iter().zip(want) {
            assert!((got - want).abs() / want < 0.01, "{got} against {want}:\n{table}");
        }
        let apis = render_apis("", &exact);
        let chat = apis.lines().find(|l| l.starts_with("chat")).unwrap();
        assert!(chat.contains("200.0ms") && chat.contains("400.0ms"), "{apis}");
    }

    #[test]
    fn labels_are_matched_by_whole_name_and_the_budget_is_the_periods() {
        let labels = "slo_service=\"chat\",slo=\"tpot\",model=\"m\"";
        assert_eq!(Exposition::label(labels, "slo"), Some("tpot"));
        assert_eq!(Exposition::label(labels, "service"), None);
        let text = "llmslo_slo_error_budget_remaining_ratio{slo_service=\"chat\",slo=\"tpot\",model=\"llama-sim-8b\"} -37.46\n";
        // 10 s into a 30-day period, a budget overspent 38.46 times over the uptime is a sliver
        // of the month's.
        let share = share_of(Duration::from_secs(10), Duration::from_secs(30 * 86_400));
        let view = render_slos(text, share, 500);
        assert!(view.contains("budget spent") && view.contains(" 0.015%"), "{view}");
        assert!(!view.contains("-3746"), "{view}");
    }

    #[test]
    fn the_capacity_line_says_what_it_waits_for() {
        let young = "llmslo_requests_total{model=\"m\",outcome=\"success\"} 312\n\
                     llmslo_capacity_knee_requests_per_second NaN\n";
        let view = render_slos(young, 0.0, 500);
        assert!(
            view.contains("knee - requests/s (it needs 500 served requests to see the SLOs' tail: 312 so far)"),
            "{view}"
        );
        let known = "llmslo_requests_total{model=\"m\",outcome=\"success\"} 812\n\
                     llmslo_capacity_knee_requests_per_second 7.2\n";
        let view = render_slos(known, 0.0, 500);
        assert!(
            view.contains("knee 7.20 requests/s at") && !view.contains("tail"),
            "{view}"
        );
    }

    #[test]
    fn sums_filter_by_model_and_outcome() {
        let text = "r_total{model=\"m\",outcome=\"success\"} 3\nr_total{model=\"m\",outcome=\"timeout\"} 1\n";
        let e = Exposition::parse(text);
        assert_eq!(e.sum("r_total", &[("model", "m")]), 4.0);
        assert_eq!(e.sum("r_total", &[("model", "m"), ("outcome", "success")]), 3.0);
    }
}
