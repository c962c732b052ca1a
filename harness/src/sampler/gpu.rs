//! The GPU through NVML (nvml-wrapper), loaded at run time.
//!
//! NVML is initialised once per run ([`Gpu::open`]); a missing library or driver is
//! a reason, never a crash: every GPU column is then null with that reason. Per-call
//! errors (GB10 answers `memory_info` with NOT_SUPPORTED) make only that column null,
//! with the error recorded once. Energy and PCIe throughput block for tens of
//! milliseconds (PCIe for its 20 ms window; the device's figures are in
//! reports/device-notes.md), so they are read about once a second on a thread of
//! their own ([`SlowReading`]).

use std::collections::HashSet;

use evidence::sample::Sample;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::Reasons;

/// Every GPU column of [`evidence::sample::SAMPLE_COLUMNS`].
pub const GPU_COLUMNS: &[&str] = &[
    "gpu_util_pct",
    "gpu_mem_util_pct",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
    "engine_gpu_mem_bytes",
    "gpu_other_procs",
    "gpu_power_mw",
    "gpu_sm_clock_mhz",
    "gpu_mem_clock_mhz",
    "gpu_temp_c",
    "gpu_energy_mj",
    "gpu_pcie_tx_kibps",
    "gpu_pcie_rx_kibps",
];

/// An initialised NVML and the index of the GPU the run uses.
pub struct Gpu {
    nvml: Nvml,
    index: u32,
}

/// One process on the GPU as NVML lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// GPU memory it holds in bytes, when the driver says.
    pub used_bytes: Option<u64>,
}

impl Gpu {
    /// Load NVML and open GPU `index`; the error is the reason to record.
    pub fn open(index: u32) -> Result<Gpu, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        if index >= count {
            return Err(format!("no GPU {index}: NVML sees {count} device(s)"));
        }
        nvml.device_by_index(index)
            .map_err(|e| format!("NVML GPU {index}: {e}"))?;
        Ok(Gpu { nvml, index })
    }

    /// The NVML instance (GPM samples borrow it).
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// The GPU's NVML handle.
    pub fn device(&self) -> Result<Device<'_>, NvmlError> {
        self.nvml.device_by_index(self.index)
    }

    /// The index of the GPU.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Whether the GPU shares host memory (NVML answers `memory_info` with
    /// NOT_SUPPORTED, as GB10 does).
    pub fn unified_memory(&self) -> bool {
        matches!(
            self.device().and_then(|d| d.memory_info()),
            Err(NvmlError::NotSupported)
        )
    }

    /// The GPU's UUID (`GPU-...`), when NVML answers.
    pub fn uuid(&self) -> Option<String> {
        self.device().ok().and_then(|d| d.uuid().ok())
    }

    /// The `gpu` manifest fragment: name, uuid, driver, CUDA version, unified
    /// memory, index. Fields NVML cannot answer are null.
    pub fn facts(&self) -> evidence::fragments::Gpu {
        let dev = self.device().ok();
        let cuda = self.nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        });
        evidence::fragments::Gpu {
            name: dev.as_ref().and_then(|d| d.name().ok()),
            uuid: dev.as_ref().and_then(|d| d.uuid().ok()),
            driver: self.nvml.sys_driver_version().ok(),
            cuda,
            unified_memory: Some(self.unified_memory()),
            index: Some(self.index),
            rest: serde_json::Map::new(),
        }
    }

    /// The compute processes on the GPU now.
    pub fn compute_processes(&self) -> Result<Vec<GpuProcess>, String> {
        let procs = self
            .device()
            .and_then(|d| d.running_compute_processes())
            .map_err(|e| format!("NVML running_compute_processes: {e}"))?;
        Ok(procs
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect())
    }

    /// The GPU utilization in percent now (for the GPU control).
    pub fn utilization_pct(&self) -> Result<u32, String> {
        self.device()
            .and_then(|d| d.utilization_rates())
            .map(|u| u.gpu)
            .map_err(|e| format!("NVML utilization_rates: {e}"))
    }
}

/// Reads the GPU columns of a sample through one device handle.
pub struct GpuProbe<'a> {
    gpu: &'a Gpu,
    dev: Device<'a>,
}

fn set_or_note<T: Into<f64>>(
    s: &mut Sample,
    reasons: &mut Reasons,
    col: &str,
    call: &str,
    r: Result<T, NvmlError>,
) {
    match r {
        Ok(v) => {
            s.set(col, Some(v.into()));
        }
        Err(e) => reasons.note(col, &format!("NVML {call}: {e}")),
    }
}

impl<'a> GpuProbe<'a> {
    /// A probe for `gpu`.
    pub fn new(gpu: &'a Gpu) -> Result<Self, String> {
        let dev = gpu.device().map_err(|e| format!("NVML device: {e}"))?;
        Ok(GpuProbe { gpu, dev })
    }

    /// The engine's GPU memory (summed over `tree`) and the count of other compute
    /// processes; what the watchdog's unified budget needs.
    pub fn read_processes(&self, s: &mut Sample, reasons: &mut Reasons, tree: &HashSet<i32>) {
        match self.gpu.compute_processes() {
            Ok(procs) => {
                let (mut mine, mut others, mut unknown) = (0u64, 0u64, false);
                for p in procs {
                    if tree.contains(&(p.pid as i32)) {
                        match p.used_bytes {
                            Some(b) => mine += b,
                            None => unknown = true,
                        }
                    } else {
                        others += 1;
                    }
                }
                if unknown && mine == 0 {
                    reasons.note(
                        "engine_gpu_mem_bytes",
                        "NVML lists the engine without its used GPU memory",
                    );
                } else {
                    s.set("engine_gpu_mem_bytes", Some(mine as f64));
                }
                s.set("gpu_other_procs", Some(others as f64));
            }
            Err(e) => {
                reasons.note("engine_gpu_mem_bytes", &e);
                reasons.note("gpu_other_procs", &e);
            }
        }
    }

    /// The fast columns (cheap calls, microseconds each).
    pub fn read_fast(&self, s: &mut Sample, reasons: &mut Reasons, tree: &HashSet<i32>) {
        match self.dev.utilization_rates() {
            Ok(u) => {
                s.set("gpu_util_pct", Some(u.gpu as f64));
                s.set("gpu_mem_util_pct", Some(u.memory as f64));
            }
            Err(e) => {
                let why = format!("NVML utilization_rates: {e}");
                reasons.note("gpu_util_pct", &why);
                reasons.note("gpu_mem_util_pct", &why);
            }
        }
        match self.dev.memory_info() {
            Ok(m) => {
                s.set("gpu_mem_used_bytes", Some(m.used as f64));
                s.set("gpu_mem_total_bytes", Some(m.total as f64));
            }
            Err(e) => {
                let why = format!("NVML memory_info: {e}");
                reasons.note("gpu_mem_used_bytes", &why);
                reasons.note("gpu_mem_total_bytes", &why);
            }
        }
        self.read_processes(s, reasons, tree);
        set_or_note(
            s,
            reasons,
            "gpu_power_mw",
            "power_usage",
            self.dev.power_usage(),
        );
        set_or_note(
            s,
            reasons,
            "gpu_sm_clock_mhz",
            "clock_info(SM)",
            self.dev.clock_info(Clock::SM),
        );
        set_or_note(
            s,
            reasons,
            "gpu_mem_clock_mhz",
            "clock_info(Memory)",
            self.dev.clock_info(Clock::Memory),
        );
        set_or_note(
            s,
            reasons,
            "gpu_temp_c",
            "temperature(GPU)",
            self.dev.temperature(TemperatureSensor::Gpu),
        );
    }
}

/// One pass over the slow columns (energy and PCIe throughput), read off the tick by
/// a [`super::periodic::Periodic`] worker: each value or why NVML refused it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowReading {
    /// `gpu_pcie_tx_kibps`: KiB/s sent over a 20 ms window.
    pub pcie_tx_kibps: Result<f64, String>,
    /// `gpu_pcie_rx_kibps`: KiB/s received over a 20 ms window.
    pub pcie_rx_kibps: Result<f64, String>,
    /// `gpu_energy_mj`: millijoules since the driver loaded, read last so that its
    /// time is the pass's end, the closest to the row it lands in.
    pub energy_mj: Result<f64, String>,
}

fn nvml<T: Into<f64>>(call: &str, r: Result<T, NvmlError>) -> Result<f64, String> {
    r.map(Into::into).map_err(|e| format!("NVML {call}: {e}"))
}

impl Gpu {
    /// Read the slow columns (tens of milliseconds: the PCIe counters block for
    /// their window). Safe to call from any thread.
    pub fn read_slow(&self) -> SlowReading {
        let dev = match self.device() {
            Ok(d) => d,
            Err(e) => {
                let why = format!("NVML device: {e}");
                return SlowReading {
                    pcie_tx_kibps: Err(why.clone()),
                    pcie_rx_kibps: Err(why.clone()),
                    energy_mj: Err(why),
                };
            }
        };
        let pcie_tx_kibps = nvml(
            "pcie_throughput(Send)",
            dev.pcie_throughput(PcieUtilCounter::Send),
        );
        let pcie_rx_kibps = nvml(
            "pcie_throughput(Receive)",
            dev.pcie_throughput(PcieUtilCounter::Receive),
        );
        let energy_mj = nvml(
            "total_energy_consumption",
            dev.total_energy_consumption().map(|v| v as f64),
        );
        SlowReading {
            pcie_tx_kibps,
            pcie_rx_kibps,
            energy_mj,
        }
    }
}

impl SlowReading {
    /// Put each value in its column of `s`, or note why it is missing.
    pub fn apply(self, s: &mut Sample, reasons: &mut Reasons) {
        for (col, v) in [
            ("gpu_pcie_tx_kibps", self.pcie_tx_kibps),
            ("gpu_pcie_rx_kibps", self.pcie_rx_kibps),
            ("gpu_energy_mj", self.energy_mj),
        ] {
            match v {
                Ok(v) => {
                    s.set(col, Some(v));
                }
                Err(why) => reasons.note(col, &why),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_columns_exist_in_the_shared_schema() {
        for c in GPU_COLUMNS {
            assert!(evidence::sample::column_index(c).is_some(), "{c}");
        }
    }

    #[test]
    fn opening_without_nvml_is_a_reason_not_a_panic() {
        // On a machine without the NVIDIA driver this is the only possible answer;
        // on the GPU machine it opens GPU 0.
        match Gpu::open(0) {
            Ok(g) => assert_eq!(g.facts().index, Some(0)),
            Err(why) => assert!(
                why.starts_with("NVML") || why.starts_with("no GPU"),
                "{why}"
            ),
        }
        let e = Gpu::open(u32::MAX).err().unwrap();
        assert!(e.contains("NVML") || e.contains("no GPU"), "{e}");
    }

    #[test]
    fn a_slow_reading_fills_its_columns_and_names_what_nvml_refused() {
        let mut s = Sample::empty(1);
        let mut reasons = Reasons::default();
        SlowReading {
            pcie_tx_kibps: Ok(1234.0),
            pcie_rx_kibps: Err("NVML pcie_throughput(Receive): not supported".into()),
            energy_mj: Ok(9_876_543.0),
        }
        .apply(&mut s, &mut reasons);
        assert_eq!(s.get("gpu_pcie_tx_kibps"), Some(1234.0));
        assert_eq!(s.get("gpu_energy_mj"), Some(9_876_543.0));
        assert_eq!(s.get("gpu_pcie_rx_kibps"), None);
        assert_eq!(
            reasons.map().get("gpu_pcie_rx_kibps").map(String::as_str),
            Some("NVML pcie_throughput(Receive): not supported")
        );
        assert_eq!(reasons.map().len(), 1, "{:?}", reasons.map());
    }
}
