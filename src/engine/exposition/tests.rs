//! Reading an engine's page: the formats, the families llmslo reads, and what it refuses.

use super::*;

const VLLM: &str = include_str!("../../../tests/fixtures/vllm-0.32-metrics.txt");

fn read(text: &str) -> Page {
    parse(text, 20_000).unwrap()
}

#[test]
fn a_real_vllm_page_reads_into_its_families() {
    let page = read(VLLM);
    assert_eq!(page.dropped, Dropped::default(), "nothing of a real page is dropped");
    let waiting = page.family("vllm:num_requests_waiting").unwrap();
    assert_eq!(waiting.kind, Kind::Gauge);
    assert_eq!(waiting.samples.len(), 1);
    assert!(label_pairs(&waiting.samples[0].labels).contains(&("model_name".into(), "tiny".into())));
    let ttft = page.family("vllm:time_to_first_token_seconds").unwrap();
    assert_eq!(ttft.kind, Kind::Histogram);
    assert!(ttft.samples.iter().any(|s| s.suffix == "_bucket"));
    assert!(ttft.samples.iter().any(|s| s.suffix == "_count"));
    assert!(
        page.families.iter().all(|f| f.kind != Kind::Untyped),
        "every sample found its typed family"
    );
}

#[test]
fn labels_with_braces_spaces_and_escapes_are_read_whole() {
    let page = read("# TYPE x gauge\nx{a=\"}{ \\\" \", b=\"2\",} 3 1700000000000\ny 1e3\n");
    assert_eq!(page.families[0].samples[0].value, 3.0);
    assert_eq!(
        &*page.families[0].samples[0].labels, "a=\"}{ \\\" \",b=\"2\"",
        "written again"
    );
    let pairs = label_pairs(&page.families[0].samples[0].labels);
    assert_eq!(
        pairs,
        [("a".to_string(), "}{ \" ".to_string()), ("b".into(), "2".into())]
    );
    assert_eq!(
        (page.families[1].name.as_str(), page.families[1].kind),
        ("y", Kind::Untyped)
    );
    assert_eq!(page.families[1].samples[0].value, 1000.0);
}

#[test]
fn every_line_that_breaks_the_grammar_is_dropped_and_counted() {
    let bad = [
        "x{a=1} 2",             // unquoted value
        "x{a=\"1\",a=\"2\"} 2", // a label twice
        "x{1a=\"1\"} 2",        // a bad label name
        "x{a-b=\"1\"} 2",
        "1x 2",                  // a name starting with a digit
        "x{a=\"1\" 2",           // no closing brace
        "x{a=\"\\t\"} 2",        // an escape the format has not
        "x one",                 // no number
        "x 1 2 3",               // more after the timestamp
        "x 1 soon",              // a timestamp that is no integer
        "x{a=\"1\"}{b=\"2\"} 1", // two label sets
        "x inf",                 // a Rust float, not the format's
        "# TYPE x dial",
        "# HELP x bad \\escape",
        "<html>oops</html>",
    ];
    let text = format!("# TYPE x gauge\nx{{a=\"ok\"}} 1\n{}\n", bad.join("\n"));
    let page = read(&text);
    assert_eq!(page.dropped.malformed, bad.len() as u64);
    assert_eq!(page.families.len(), 1);
    assert_eq!(page.families[0].samples.len(), 1, "the good line stays");
}

#[test]
fn a_page_of_nothing_but_other_text_is_no_page() {
    assert_eq!(
        parse("<html>\n<body>oops</body>\n</html>\n", 100),
        Err(PageError::NotText(3))
    );
    assert_eq!(parse("", 100), Ok(Page::default()), "an engine with no metrics yet");
}

#[test]
fn a_series_twice_keeps_the_first() {
    let page = read("# TYPE x gauge\nx{a=\"1\"} 1\nx{a=\"1\"} 2\nx{a=\"2\"} 3\n");
    assert_eq!(page.families[0].samples.len(), 2);
    assert_eq!(page.dropped.malformed, 1);
}

#[test]
fn impossible_counts_leave_their_family_out() {
    let page = read(
        "# TYPE c counter\nc_total -5\n# TYPE h histogram\nh_bucket{le=\"1\"} -1\nh_bucket{le=\"+Inf\"} 2\n\
         h_sum 3\nh_count 2\n# TYPE g gauge\ng -5\n# TYPE d counter\nd_total NaN\n",
    );
    let names: Vec<&str> = page.families.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["g"], "a gauge may be negative");
    assert_eq!(page.dropped.invalid_value, 6);
}

#[test]
fn families_under_llmslos_names_are_never_read() {
    let page = read(
        "# TYPE llmslo_slo_bad_events counter\nllmslo_slo_bad_events_total{slo=\"a\",extra=\"x\"} 999\n\
         gen_ai_server_time_to_first_token_seconds_bucket{le=\"1\",x=\"y\"} 5\n# TYPE ok gauge\nok 1\n",
    );
    assert_eq!(page.families.len(), 1);
    assert_eq!(page.dropped.reserved_name, 2);
}

#[test]
fn a_page_over_the_cap_is_refused_whole() {
    let lines: String = (0..101).map(|i| format!("a{i} 1\n")).collect();
    assert_eq!(parse(&lines, 100), Err(PageError::TooLarge(100)));
    let types: String = (0..101).map(|i| format!("# TYPE a{i} gauge\n")).collect();
    assert_eq!(parse(&types, 100), Err(PageError::TooLarge(100)), "families count too");
    let same: String = (0..101).map(|i| format!("a{{i=\"{i}\"}} 1\n")).collect();
    assert!(parse(&same, 100).is_err(), "and samples of one family");
}

#[test]
fn own_names_cover_every_series_name_of_a_family() {
    let own = OwnNames::new(["llama_requests", "x_total", "h"]);
    for name in [
        "llama_requests_total",
        "x",
        "x_total",
        "x_created",
        "h_bucket",
        "h_count",
        "h_sum",
    ] {
        assert!(own.contains(name), "{name}");
    }
    assert!(own.contains("llmslo_anything"), "a reserved prefix");
    assert!(!own.contains("vllm:num_requests_waiting"));
}

#[test]
fn openmetrics_names_counters_without_total_and_drops_created_gauges() {
    let page = read(VLLM);
    let mut out = String::new();
    write_openmetrics(&page, &OwnNames::new(["process_cpu_seconds"]), &mut out);
    assert!(out.contains("# TYPE vllm:num_preemptions counter\n"));
    assert!(out.contains("\nvllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 0.0\n"));
    assert!(!out.contains("vllm:num_preemptions_created"));
    assert!(
        !out.contains("vllm:iteration_tokens_total_created"),
        "a histogram's too"
    );
    assert!(out.contains("# TYPE vllm:iteration_tokens_total histogram\n"));
    assert!(out.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));
    assert!(!out.contains("# TYPE process_cpu_seconds"));
    let types = out.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let names: HashSet<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(types, names.len(), "no family twice");
}

#[test]
fn a_family_whose_sample_names_collide_is_left_out() {
    // A gauge named like llmslo's own histogram's bucket series, and like another family's.
    let page = read("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n# TYPE h_count gauge\nh_count 7\n# TYPE mine_bucket gauge\nmine_bucket 1\n");
    let mut out = String::new();
    let collided = write_openmetrics(&page, &OwnNames::new(["mine"]), &mut out);
    assert_eq!(collided, 2);
    assert!(!out.contains("h_count 7") && !out.contains("mine_bucket"), "{out}");
    assert!(out.contains("h_count 1"));
}
