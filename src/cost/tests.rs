//! The cost meter's tests: exact figures under paused time, and shares that add up.

use super::*;
use crate::record::LabelText;
use crate::record::Operation;

fn meter(settings: CostSettings) -> Arc<CostMeter> {
    CostMeter::new(
        settings,
        Duration::from_secs(30 * 24 * 3600),
        None,
        Box::new(|| LabelText::from("chat")),
        &mut Registry::default(),
    )
}

fn tokens(tenant: Option<&str>, input: u64, output: u64) -> RequestRecord {
    RequestRecord {
        input_tokens: Some(input),
        output_tokens: Some(output),
        tenant: tenant.map(LabelText::from),
        ..RequestRecord::new("m".into(), Operation::Chat, Duration::from_secs(1))
    }
}

fn priced(per_hour: f64, gpus: u32) -> CostSettings {
    CostSettings {
        gpu_hour_price: Some(per_hour),
        gpus,
        ..CostSettings::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_million_tokens_cost_the_windows_cost_over_its_weighted_tokens() {
    // Two accelerators at 3.60 an hour: 0.002 a second.
    let meter = meter(priced(3.6, 2));
    meter.finished(&tokens(None, 1000, 100));
    meter.finished(&tokens(None, 0, 300));
    tokio::time::advance(Duration::from_secs(100)).await;
    let s = meter.snapshot(Instant::now());
    assert_eq!(s.per_hour, 7.2);
    assert!((s.total - 0.2).abs() < 1e-12, "{}", s.total);
    let five = &s.windows[0];
    assert_eq!(five.window, "5m");
    assert!(
        (five.cost - 0.2).abs() < 1e-12,
        "the window is the uptime while shorter"
    );
    // 100 + 300 output tokens, 1000 input tokens at 0.1: 500 weighted tokens.
    assert!(
        (five.per_million_output - 0.2e6 / 500.0).abs() < 1e-6,
        "{}",
        five.per_million_output
    );
    assert!((five.per_million_input - 0.1 * 0.2e6 / 500.0).abs() < 1e-6);
    assert!(five.shares.is_empty(), "no tenants, no shares");
    // Ten minutes later, the 5m window holds five minutes of cost and no tokens.
    tokio::time::advance(Duration::from_secs(600)).await;
    let s = meter.snapshot(Instant::now());
    assert!((s.windows[0].cost - 0.6).abs() < 1e-9, "{}", s.windows[0].cost);
    assert!(s.windows[0].per_million_output.is_nan(), "no tokens in the window");
    assert!((s.windows[1].cost - 1.4).abs() < 1e-9, "30m: the whole uptime");
    assert!(s.windows[1].per_million_output.is_finite());
}

#[tokio::test(start_paused = true)]
async fn the_tenants_shares_add_up_to_the_whole() {
    let meter = meter(priced(2.5, 1));
    let mix = [("a", 4000, 250), ("b", 120, 900), ("c", 0, 30), ("a", 10, 10)];
    for (tenant, input, output) in mix {
        meter.finished(&tokens(Some(tenant), input, output));
        tokio::time::advance(Duration::from_secs(7)).await;
    }
    let s = meter.snapshot(Instant::now());
    for w in &s.windows {
        let shares: f64 = w.shares.iter().map(|(_, share)| share).sum();
        assert!((shares - 1.0).abs() < 0.01, "{}: {shares}", w.window);
        let costs: f64 = w.shares.iter().map(|(_, share)| share * w.cost).sum();
        assert!((costs - w.cost).abs() <= 0.01 * w.cost, "{}", w.window);
    }
    let a = &s.windows[0].shares[0];
    assert_eq!(a.0, TenantLabel(Some("a".into())));
    // a: 260 output + 0.1 x 4010 input = 661 of 661 + 912 + 30.
    assert!((a.1 - 661.0 / 1603.0).abs() < 1e-9, "{}", a.1);
}

#[test]
fn cost_is_off_without_a_price() {
    assert!(!CostSettings::default().enabled());
    assert!(priced(1.0, 1).enabled());
    let per_model = CostSettings {
        gpu_hour_prices: BTreeMap::from([("NVIDIA H100 80GB HBM3".to_string(), 4.0)]),
        ..CostSettings::default()
    };
    assert!(per_model.enabled());
}

#[test]
fn the_cost_between_two_points_is_on_the_line_between_them() {
    let t0 = Instant::now();
    let history = VecDeque::from([(t0, 0.0), (t0 + Duration::from_secs(100), 10.0)]);
    assert_eq!(spent_at(&history, Some(t0 + Duration::from_secs(25))), 2.5);
    assert_eq!(spent_at(&history, None), 0.0, "before the start");
    assert_eq!(spent_at(&history, Some(t0 + Duration::from_secs(200))), 10.0);
}

#[tokio::test(start_paused = true)]
async fn each_gpu_model_has_its_price_and_its_energy_is_priced_by_the_kwh() {
    use crate::gpu::{DeviceSnapshot, GpuState, Snapshot};
    let gpu = GpuState::new(Duration::from_secs(1));
    let device = |index: u32, name: &str, joules: f64| DeviceSnapshot {
        index,
        uuid: format!("GPU-{index}"),
        name: name.to_string(),
        utilization_ratio: None,
        memory_used_bytes: None,
        memory_total_bytes: None,
        power_watts: Some(500.0),
        temperature_celsius: None,
        energy_joules: Some(joules),
        sm_clock_hertz: None,
        processes: Vec::new(),
    };
    let publish = |joules: f64| {
        gpu.publish(Some(Snapshot {
            taken_at: Instant::now(),
            devices: vec![
                device(0, "NVIDIA H100 80GB HBM3", joules),
                device(1, "NVIDIA L4", joules),
            ],
        }))
    };
    let settings = CostSettings {
        gpu_hour_price: Some(1.0),
        gpu_hour_prices: BTreeMap::from([("NVIDIA H100 80GB HBM3".to_string(), 4.0)]),
        energy_price_per_kwh: Some(0.5),
        ..CostSettings::default()
    };
    let meter = CostMeter::new(
        settings,
        Duration::from_secs(86_400),
        Some(gpu.clone()),
        Box::new(|| LabelText::from("chat")),
        &mut Registry::default(),
    );
    publish(1_000_000.0);
    let first = meter.snapshot(Instant::now());
    // The H100 at 4.00, the L4 at the one figure: 5.00 an hour, plus 2 x 500 W at 0.50 a kWh.
    assert_eq!(first.per_hour, 5.0 + 1.0 * 0.5);
    tokio::time::advance(Duration::from_secs(360)).await;
    // Each GPU drew 0.05 kWh (180 kJ) in those 6 minutes.
    publish(1_180_000.0);
    let s = meter.snapshot(Instant::now());
    let expected = 5.0 / 10.0 + 2.0 * 0.05 * 0.5;
    assert!(
        (s.total - first.total - expected).abs() < 1e-9,
        "{} vs {expected}",
        s.total - first.total
    );
}
