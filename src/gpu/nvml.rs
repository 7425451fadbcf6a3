//! The NVML implementation of [`DeviceSource`], through `nvml-wrapper` (the library is
//! loaded at run time, so the binary runs where no driver exists).

use super::{DeviceSource, GpuError, RawReading};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::ffi::OsStr;

/// The driver's management library, as the system installs it.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// An initialised NVML.
pub struct NvmlSource {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlSource")
    }
}

impl NvmlSource {
    /// Loads and initialises NVML from `library`.
    pub fn open(library: &str) -> Result<Self, GpuError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
            .map_err(from_nvml)?;
        Ok(Self { nvml })
    }
}

fn from_nvml(error: NvmlError) -> GpuError {
    match error {
        NvmlError::NotSupported => GpuError::NotSupported,
        NvmlError::GpuLost => GpuError::GpuLost,
        NvmlError::NoPermission => GpuError::NoPermission,
        other => GpuError::Other(other.to_string()),
    }
}

impl DeviceSource for NvmlSource {
    fn device_count(&mut self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(from_nvml)
    }

    fn read(&mut self, index: u32, processes: bool) -> Result<RawReading, GpuError> {
        let device = self.nvml.device_by_index(index).map_err(from_nvml)?;
        Ok(RawReading {
            index,
            uuid: device.uuid().map_err(from_nvml)?,
            name: device.name().unwrap_or_else(|_| "unknown".to_string()),
            utilization_percent: device.utilization_rates().map(|u| u.gpu).map_err(from_nvml),
            memory_bytes: device.memory_info().map(|m| (m.used, m.total)).map_err(from_nvml),
            power_milliwatts: device.power_usage().map_err(from_nvml),
            temperature_celsius: device.temperature(TemperatureSensor::Gpu).map_err(from_nvml),
            energy_millijoules: device.total_energy_consumption().map_err(from_nvml),
            sm_clock_mhz: device.clock_info(Clock::SM).map_err(from_nvml),
            processes: processes.then(|| {
                device
                    .running_compute_processes()
                    .map(|list| {
                        list.into_iter()
                            .filter_map(|p| match p.used_gpu_memory {
                                UsedGpuMemory::Used(bytes) => Some((p.pid, bytes)),
                                UsedGpuMemory::Unavailable => None,
                            })
                            .collect()
                    })
                    .map_err(from_nvml)
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_crash() {
        let error = NvmlSource::open("/nonexistent/libnvidia-ml.so.1").unwrap_err();
        assert!(matches!(error, GpuError::Other(_)), "{error:?}");
    }
}
