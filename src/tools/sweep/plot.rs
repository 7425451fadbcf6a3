//! The sweep's plot (SVG): per-user against aggregate output tokens/s with each point's load,
//! the TPOT SLO's limit and the knee; beside it TTFT and TPOT p99 against load.
//! A comparison draws both targets: their frontiers, attainment and goodput against load.

use super::report::{Knee, Report};
use super::stats::{Judgement, Load, StepResult};
use crate::slo::spec::SloKind;
use plotters::prelude::*;

const KNEE_COLOUR: RGBColor = RGBColor(214, 39, 40);
const TTFT_COLOUR: RGBColor = RGBColor(31, 119, 180);
const TPOT_COLOUR: RGBColor = RGBColor(255, 127, 14);
const LIMIT_COLOUR: RGBColor = RGBColor(120, 120, 120);

/// The report as an SVG document.
pub fn render(report: &Report) -> Result<String, String> {
    document((1200, 500), |root| {
        let (left, right) = root.split_horizontally(600);
        seesaw(&left, report)?;
        latency(&right, report)
    })
}

/// An SVG document `size` pixels large, drawn by `draw` on its white root.
fn document(size: (u32, u32), draw: impl FnOnce(&Area) -> DrawResult) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(error)?;
        draw(&root).map_err(error)?;
        root.present().map_err(error)?;
    }
    Ok(svg)
}

/// A chart on `area` with its caption, the house margins and linear axes over `x` and `y`.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    Ok(ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x, y)?)
}

/// The frontier's chart: per-user against aggregate output tokens/s, from zero.
fn frontier_chart<'a, 'b>(
    area: &'a Area<'b>,
    x_max: f64,
    y_max: f64,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    let mut frontier = chart(area, "Per-user speed against throughput", 0.0..x_max, 0.0..y_max)?;
    frontier
        .configure_mesh()
        .x_desc("aggregate output tokens/s")
        .y_desc("output tokens/s per user")
        .draw()?;
    Ok(frontier)
}

/// The chart's legend, boxed, at `position`.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, position: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()?;
    Ok(())
}

fn error(e: impl std::fmt::Display) -> String {
    format!("drawing the plot: {e}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Per-user output tokens/s against aggregate output tokens/s.
fn seesaw(area: &Area, report: &Report) -> DrawResult {
    let steps: Vec<&StepResult> = report
        .steps
        .iter()
        .filter(|s| s.output_tokens_per_second.is_finite() && s.per_user_tokens_per_second.is_finite())
        .collect();
    let tpot_limits: Vec<(String, f64)> = report
        .slos
        .slos
        .iter()
        .filter_map(|s| match s.kind {
            SloKind::Tpot(t) => Some((s.name.to_string(), 1.0 / t.as_secs_f64())),
            _ => None,
        })
        .collect();
    let x_max = steps.iter().map(|s| s.output_tokens_per_second).fold(1.0, f64::max) * 1.15;
    let y_max = steps
        .iter()
        .map(|s| s.per_user_tokens_per_second)
        .chain(tpot_limits.iter().map(|l| l.1))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = frontier_chart(area, x_max, y_max)?;
    for (name, limit) in &tpot_limits {
        chart
            .draw_series(LineSeries::new(
                [(0.0, *limit), (x_max, *limit)],
                LIMIT_COLOUR.stroke_width(1),
            ))?
            .label(format!("{name}: {limit:.1} tok/s/user"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LIMIT_COLOUR));
    }
    let points: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| (s.output_tokens_per_second, s.per_user_tokens_per_second))
        .collect();
    chart.draw_series(LineSeries::new(points.clone(), TTFT_COLOUR.mix(0.4)))?;
    chart.draw_series(steps.iter().map(|s| {
        let at = (s.output_tokens_per_second, s.per_user_tokens_per_second);
        let colour = match s.verdict() {
            Judgement::Met => TTFT_COLOUR.to_rgba(),
            Judgement::Missed => KNEE_COLOUR.mix(0.5),
            Judgement::Unjudged => TTFT_COLOUR.mix(0.3),
            Judgement::ClientLimited => CLIENT_LIMITED_COLOUR.mix(0.6),
        };
        EmptyElement::at(at)
            + Circle::new((0, 0), 4, colour.filled())
            + Text::new(load_label(s.load), (6, -14), ("sans-serif", 12))
    }))?;
    if let Some(knee) = steps.iter().find(|s| Some(s.load) == report.knee.load) {
        chart
            .draw_series([Circle::new(
                (knee.output_tokens_per_second, knee.per_user_tokens_per_second),
                9,
                KNEE_COLOUR.stroke_width(2),
            )])?
            .label(knee_label(&report.knee))
            .legend(|(x, y)| Circle::new((x + 10, y), 5, KNEE_COLOUR.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)
}

/// TTFT and TPOT p99 against load, with their SLO thresholds and the knee.
fn latency(area: &Area, report: &Report) -> DrawResult {
    let load_of = |s: &StepResult| s.load.value();
    let x_name = match report.steps.first().map(|s| s.load) {
        Some(Load::Rate(_)) => "request rate (req/s)",
        _ => "concurrency",
    };
    let x_max = report.steps.iter().map(load_of).fold(1.0, f64::max) * 1.1;
    let thresholds: Vec<(String, f64, RGBColor)> = report
        .slos
        .slos
        .iter()
        .filter_map(|s| match s.kind {
            SloKind::Ttft(t) => Some((s.name.to_string(), t.as_secs_f64() * 1e3, TTFT_COLOUR)),
            SloKind::Tpot(t) => Some((s.name.to_string(), t.as_secs_f64() * 1e3, TPOT_COLOUR)),
            _ => None,
        })
        .collect();
    let y_max = report
        .steps
        .iter()
        .flat_map(|s| [s.ttft.p99 * 1e3, s.tpot.p99 * 1e3])
        .filter(|v| v.is_finite())
        .chain(thresholds.iter().map(|t| t.1))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = chart(area, "p99 latency against load", 0.0..x_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc(x_name).y_desc("milliseconds").draw()?;
    type Figure = fn(&StepResult) -> f64;
    let figures: [(&str, Figure, RGBColor); 2] = [
        ("TTFT p99", |s| s.ttft.p99, TTFT_COLOUR),
        ("TPOT p99", |s| s.tpot.p99, TPOT_COLOUR),
    ];
    for (name, figure, colour) in figures {
        let points: Vec<(f64, f64)> = report
            .steps
            .iter()
            .map(|s| (load_of(s), figure(s) * 1e3))
            .filter(|p| p.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
    }
    for (name, threshold, colour) in &thresholds {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, *threshold), (x_max, *threshold)],
                6,
                4,
                colour.stroke_width(1),
            ))?
            .label(format!("{name} ≤ {threshold} ms"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(1)));
    }
    if let Some(knee) = report.knee.load {
        let x = knee.value();
        chart
            .draw_series(LineSeries::new([(x, 0.0), (x, y_max)], KNEE_COLOUR.stroke_width(2)))?
            .label(knee_label(&report.knee))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], KNEE_COLOUR.stroke_width(2)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// The knee's legend: its load when reached, else the highest load held and "not reached".
fn knee_label(knee: &Knee) -> String {
    match (knee.reached_load(), knee.load) {
        (Some(load), _) => format!("knee: {}", load_label(load)),
        (None, Some(held)) => format!("knee not reached (held up to {})", load_label(held)),
        (None, None) => "knee not reached".to_string(),
    }
}

/// A step whose client fell behind: judged by neither side.
const CLIENT_LIMITED_COLOUR: RGBColor = RGBColor(127, 127, 127);

fn load_label(load: Load) -> String {
    match load {
        Load::Concurrency(c) => format!("c={c}"),
        Load::Rate(r) => format!("{r}/s"),
    }
}

/// A's colour in a comparison.
const A_COLOUR: RGBColor = RGBColor(31, 119, 180);
/// B's colour in a comparison.
const B_COLOUR: RGBColor = RGBColor(255, 127, 14);

/// Two curves (a comparison's, live or saved) as an SVG document: both frontiers, then
/// attainment and goodput against the offered load, each with its knee.
pub fn render_comparison(a: &Report, b: &Report) -> Result<String, String> {
    document((1500, 500), |root| {
        let panels = root.split_evenly((1, 3));
        let sides = [("A", a, A_COLOUR), ("B", b, B_COLOUR)];
        frontiers(&panels[0], &sides)?;
        type Figure = fn(&StepResult) -> f64;
        let attainment: Figure = |s| {
            s.attainment
                .iter()
                .filter(|a| a.required)
                .map(|a| a.attainment * 100.0)
                .fold(f64::INFINITY, f64::min)
        };
        let goodput: Figure = |s| s.goodput_requests_per_second;
        // The attainment panel shows the objective the worst deciding SLO must meet.
        let objective = a.steps.first().and_then(|s| {
            s.attainment
                .iter()
                .filter(|a| a.required)
                .map(|a| a.objective * 100.0)
                .reduce(f64::max)
        });
        let title = "Attainment (worst deciding SLO)";
        against_load(&panels[1], &sides, title, "% of requests good", attainment, objective)?;
        against_load(
            &panels[2],
            &sides,
            "Goodput",
            "requests/s meeting the SLOs",
            goodput,
            None,
        )
    })
}

type Side<'a> = (&'a str, &'a Report, RGBColor);

/// Per-user against aggregate output tokens/s, one line a side, its knee circled.
fn frontiers(area: &Area, sides: &[Side]) -> DrawResult {
    let all = sides.iter().flat_map(|(_, r, _)| &r.steps);
    let finite: Vec<&StepResult> = all
        .filter(|s| s.output_tokens_per_second.is_finite() && s.per_user_tokens_per_second.is_finite())
        .collect();
    let x_max = finite.iter().map(|s| s.output_tokens_per_second).fold(1.0, f64::max) * 1.15;
    let y_max = finite.iter().map(|s| s.per_user_tokens_per_second).fold(1.0, f64::max) * 1.15;
    let mut chart = frontier_chart(area, x_max, y_max)?;
    for (name, report, colour) in sides {
        let colour = *colour;
        let points: Vec<(f64, f64)> = report
            .steps
            .iter()
            .map(|s| (s.output_tokens_per_second, s.per_user_tokens_per_second))
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(match report.knee.reached_load() {
                Some(_) => format!("{name}: {}", report.target),
                None => format!("{name}: {} (knee not reached)", report.target),
            })
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
        let knee = report.knee.reached_load();
        if let Some(knee) = report.steps.iter().find(|s| Some(s.load) == knee) {
            chart.draw_series([Circle::new(
                (knee.output_tokens_per_second, knee.per_user_tokens_per_second),
                9,
                colour.stroke_width(2),
            )])?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)
}

/// One figure against the offered load, one line a side, a dashed line at each side's knee
/// and a grey one at the `target` the figure must meet, if any.
fn against_load(
    area: &Area,
    sides: &[Side],
    caption: &str,
    unit: &str,
    figure: fn(&StepResult) -> f64,
    target: Option<f64>,
) -> DrawResult {
    let load_of = |s: &StepResult| s.load.value();
    let x_name = match sides[0].1.steps.first().map(|s| s.load) {
        Some(Load::Rate(_)) => "offered rate (req/s)",
        _ => "concurrency",
    };
    let steps = || sides.iter().flat_map(|(_, r, _)| &r.steps);
    let x_max = steps().map(load_of).fold(1.0, f64::max) * 1.1;
    let x_min = steps().map(load_of).fold(x_max, f64::min) * 0.9;
    let values: Vec<f64> = steps().map(figure).filter(|v| v.is_finite()).collect();
    let y_max = values.iter().copied().fold(1.0, f64::max) * 1.1;
    let y_min = values.iter().copied().fold(y_max, f64::min).min(0.0);
    let mut chart = chart(area, caption, x_min..x_max, y_min..y_max)?;
    chart.configure_mesh().x_desc(x_name).y_desc(unit).draw()?;
    if let Some(target) = target {
        chart
            .draw_series(DashedLineSeries::new(
                [(x_min, target), (x_max, target)],
                6,
                4,
                LIMIT_COLOUR.stroke_width(1),
            ))?
            .label(format!("objective {target} %"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LIMIT_COLOUR));
    }
    for (name, report, colour) in sides {
        let colour = *colour;
        let points: Vec<(f64, f64)> = report
            .steps
            .iter()
            .map(|s| (load_of(s), figure(s)))
            .filter(|p| p.1.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
        if let Some(knee) = report.knee.reached_load() {
            let x = knee.value();
            chart.draw_series(DashedLineSeries::new(
                [(x, y_min), (x, y_max)],
                6,
                4,
                colour.stroke_width(1),
            ))?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}
