//! The sampler and collector against a fake device source.

use super::*;
use prometheus_client::registry::Registry;

/// Scripted devices: each `None` field fails with the given error.
#[derive(Debug, Clone, Default)]
struct Fake {
    devices: Vec<Option<RawReading>>,
    count_error: Option<GpuError>,
}

impl DeviceSource for Fake {
    fn device_count(&mut self) -> Result<u32, GpuError> {
        match &self.count_error {
            Some(error) => Err(error.clone()),
            None => Ok(self.devices.len() as u32),
        }
    }

    fn read(&mut self, index: u32, _processes: bool) -> Result<RawReading, GpuError> {
        self.devices[index as usize].clone().ok_or(GpuError::GpuLost)
    }
}

fn h100(index: u32) -> RawReading {
    RawReading {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H100 80GB HBM3".into(),
        utilization_percent: Ok(87),
        memory_bytes: Ok((40 << 30, 80 << 30)),
        power_milliwatts: Ok(250_500),
        temperature_celsius: Ok(61),
        energy_millijoules: Ok(1_500_000),
        sm_clock_mhz: Ok(1980),
        processes: Some(Ok(vec![(4242, 30 << 30), (7, 1 << 20)])),
    }
}

fn encode(state: &Arc<GpuState>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(GpuCollector(state.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

fn sampled(fake: &mut Fake) -> Arc<GpuState> {
    let state = GpuState::new(Duration::from_secs(1));
    state.publish(sample(fake, true, &mut Warnings::default(), Instant::now()));
    state
}

#[tokio::test(start_paused = true)]
async fn units_are_converted() {
    let mut fake = Fake {
        devices: vec![Some(h100(0))],
        ..Fake::default()
    };
    let snapshot = sample(&mut fake, true, &mut Warnings::default(), Instant::now()).unwrap();
    let d = &snapshot.devices[0];
    assert_eq!(d.utilization_ratio, Some(0.87), "percent to ratio");
    assert_eq!(d.power_watts, Some(250.5), "mW to W");
    assert_eq!(d.energy_joules, Some(1500.0), "mJ to J");
    assert_eq!(d.sm_clock_hertz, Some(1.98e9), "MHz to Hz");
    assert_eq!(d.memory_used_bytes, Some(40 << 30));
    assert_eq!(d.memory_total_bytes, Some(80 << 30));
    assert_eq!(d.processes, [(4242, 30 << 30), (7, 1 << 20)]);

    let text = encode(&sampled(&mut fake));
    let l = "gpu=\"0\",uuid=\"GPU-0\",gpu_model=\"NVIDIA H100 80GB HBM3\"";
    for line in [
        "llmslo_gpu_up 1".to_string(),
        format!("llmslo_gpu_utilization_ratio{{{l}}} 0.87"),
        format!("llmslo_gpu_power_watts{{{l}}} 250.5"),
        format!("llmslo_gpu_energy_joules_total{{{l}}} 1500.0"),
        format!("llmslo_gpu_memory_total_bytes{{{l}}} 85899345920.0"),
        format!("llmslo_gpu_temperature_celsius{{{l}}} 61.0"),
        "llmslo_gpu_process_memory_bytes{gpu=\"0\",uuid=\"GPU-0\",pid=\"4242\"}".to_string(),
        "llmslo_gpu_sample_age_seconds 0.0".to_string(),
        "# TYPE llmslo_gpu_energy_joules counter".to_string(),
    ] {
        assert!(text.contains(&line), "missing {line} in\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_reading_drops_only_its_series() {
    let mut broken = h100(1);
    broken.power_milliwatts = Err(GpuError::NotSupported);
    broken.energy_millijoules = Err(GpuError::NoPermission);
    let mut fake = Fake {
        devices: vec![Some(h100(0)), Some(broken)],
        ..Fake::default()
    };
    let text = encode(&sampled(&mut fake));
    assert!(text.contains("llmslo_gpu_power_watts{gpu=\"0\""));
    assert!(!text.contains("llmslo_gpu_power_watts{gpu=\"1\""));
    assert!(!text.contains("llmslo_gpu_energy_joules_total{gpu=\"1\""));
    assert!(
        text.contains("llmslo_gpu_utilization_ratio{gpu=\"1\""),
        "the rest of device 1 stays"
    );
    assert!(text.contains("llmslo_gpu_up 1"));
}

#[tokio::test(start_paused = true)]
async fn a_device_that_disappears_loses_its_series() {
    let mut fake = Fake {
        devices: vec![Some(h100(0)), Some(h100(1))],
        ..Fake::default()
    };
    assert!(encode(&sampled(&mut fake)).contains("gpu=\"1\""));
    fake.devices[1] = None; // lost: reading it fails
    let text = encode(&sampled(&mut fake));
    assert!(!text.contains("gpu=\"1\"") && text.contains("gpu=\"0\""));
    fake.devices.truncate(1); // gone from the count
    assert!(!encode(&sampled(&mut fake)).contains("gpu=\"1\""));
}

#[tokio::test(start_paused = true)]
async fn a_stale_snapshot_is_not_exported() {
    let mut fake = Fake {
        devices: vec![Some(h100(0))],
        ..Fake::default()
    };
    let state = sampled(&mut fake);
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(
        encode(&state).contains("llmslo_gpu_up 1"),
        "within max(3 intervals, 5 s)"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    let text = encode(&state);
    assert!(text.contains("llmslo_gpu_up 0"));
    assert!(text.contains("llmslo_gpu_sample_age_seconds 6.0"));
    assert!(!text.contains("llmslo_gpu_utilization_ratio{"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn no_devices_listed_means_down_and_no_series() {
    let state = GpuState::new(Duration::from_secs(1));
    let text = encode(&state);
    assert!(text.contains("llmslo_gpu_up 0") && !text.contains("llmslo_gpu_sample_age_seconds"));
    let mut fake = Fake {
        count_error: Some(GpuError::Other("Driver Not Loaded".into())),
        ..Fake::default()
    };
    let text = encode(&sampled(&mut fake));
    assert!(text.contains("llmslo_gpu_up 0") && !text.contains("{gpu="));
}

#[tokio::test(start_paused = true)]
async fn each_kind_of_failure_is_warned_once_an_hour() {
    let mut warnings = Warnings::default();
    let now = Instant::now();
    assert!(warnings.report("power", &GpuError::NotSupported, now));
    assert!(!warnings.report("power", &GpuError::NotSupported, now + Duration::from_secs(1)));
    assert!(warnings.report("power", &GpuError::NoPermission, now), "another kind");
    assert!(
        warnings.report("energy", &GpuError::NotSupported, now),
        "another reading"
    );
    assert!(warnings.report("power", &GpuError::NotSupported, now + Duration::from_secs(3601)));
}

#[tokio::test(start_paused = true)]
async fn the_sampler_publishes_on_its_interval() {
    let fake = Fake {
        devices: vec![Some(h100(0))],
        ..Fake::default()
    };
    let state = GpuState::new(Duration::from_millis(500));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_sampler(Box::new(fake), false, state.clone(), shutdown.clone()));
    for _ in 0..50 {
        if encode(&state).contains("llmslo_gpu_up 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(encode(&state).contains("llmslo_gpu_up 1"));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_device_name_that_needs_escaping_is_escaped() {
    let mut odd = h100(0);
    odd.name = "Odd \"GPU\" \\ 1".into();
    let mut fake = Fake {
        devices: vec![Some(odd)],
        ..Fake::default()
    };
    let text = encode(&sampled(&mut fake));
    assert!(
        text.contains(r#"gpu_model="Odd \"GPU\" \\ 1""#),
        "escaped per the exposition format:\n{text}"
    );
}
