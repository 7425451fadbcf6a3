//! A simulated GPU for the demo and for dashboards on machines without one
//! (`gpu.simulated: true`): one device whose load follows a slow two-minute wave, with power,
//! temperature and energy that follow the load the way a real card's do.

use super::{DeviceSource, GpuError, RawReading};
use std::time::{Duration, Instant};

/// Length of one load wave.
const WAVE: Duration = Duration::from_secs(120);
/// Idle and full-load power, milliwatts (an H100 SXM's range).
const POWER_MW: (f64, f64) = (70_000.0, 700_000.0);
/// Memory on the card and the share an engine keeps allocated (vLLM's default 0.9).
const MEMORY_TOTAL: u64 = 80 * 1024 * 1024 * 1024;
const MEMORY_USED: u64 = MEMORY_TOTAL / 10 * 9;

/// One simulated device; energy is the integral of the simulated power.
#[derive(Debug)]
pub struct SimulatedSource {
    started: Instant,
    last: Instant,
    energy_mj: f64,
}

impl SimulatedSource {
    /// A device whose wave starts now.
    pub fn new() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            energy_mj: 0.0,
        }
    }

    fn utilization(&self, at: Instant) -> f64 {
        let phase = at.duration_since(self.started).as_secs_f64() / WAVE.as_secs_f64();
        0.6 + 0.3 * (phase * std::f64::consts::TAU).sin()
    }
}

impl Default for SimulatedSource {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceSource for SimulatedSource {
    fn device_count(&mut self) -> Result<u32, GpuError> {
        Ok(1)
    }

    fn read(&mut self, index: u32, processes: bool) -> Result<RawReading, GpuError> {
        let now = Instant::now();
        let load = self.utilization(now);
        let power_mw = POWER_MW.0 + (POWER_MW.1 - POWER_MW.0) * load;
        self.energy_mj += power_mw * now.duration_since(self.last).as_secs_f64();
        self.last = now;
        Ok(RawReading {
            index,
            uuid: "GPU-00000000-0000-0000-0000-simulated000".to_string(),
            name: "llmslo simulated GPU".to_string(),
            utilization_percent: Ok((load * 100.0).round() as u32),
            memory_bytes: Ok((MEMORY_USED, MEMORY_TOTAL)),
            power_milliwatts: Ok(power_mw.round() as u32),
            temperature_celsius: Ok((35.0 + 40.0 * load).round() as u32),
            energy_millijoules: Ok(self.energy_mj as u64),
            sm_clock_mhz: Ok(1980),
            processes: processes.then(|| Ok(vec![(std::process::id(), MEMORY_USED)])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_stay_in_range_and_energy_only_grows() {
        let mut source = SimulatedSource::new();
        assert_eq!(source.device_count(), Ok(1));
        let mut last_energy = 0;
        for step in 0..5 {
            std::thread::sleep(Duration::from_millis(5));
            let reading = source.read(0, step % 2 == 0).expect("simulated devices never fail");
            let percent = reading.utilization_percent.unwrap();
            assert!((30..=90).contains(&percent), "{percent}");
            let watts = reading.power_milliwatts.unwrap() as f64 / 1000.0;
            assert!((70.0..=700.0).contains(&watts), "{watts}");
            let energy = reading.energy_millijoules.unwrap();
            assert!(energy >= last_energy);
            last_energy = energy;
            assert_eq!(reading.processes.is_some(), step % 2 == 0);
        }
        assert!(last_energy > 0, "about 25 ms at 250 W or more is over 6 J");
    }

    #[test]
    fn the_wave_peaks_a_quarter_in_and_bottoms_out_three_quarters_in() {
        let source = SimulatedSource::new();
        let peak = source.utilization(source.started + WAVE / 4);
        let trough = source.utilization(source.started + WAVE * 3 / 4);
        assert!((peak - 0.9).abs() < 1e-9 && (trough - 0.3).abs() < 1e-9);
    }
}
