//! The sampler's columns: name, storage type, unit, averaging window, source.
//!
//! A sample is one row taken at one tick of the sampler. Every value is optional:
//! a sensor that cannot be read is `None` (stored as Parquet null) and the reason is
//! recorded once in the manifest; it is never written as 0.
//!
//! The sealed `samples.parquet` has the columns `t_ns` (CLOCK_MONOTONIC), `phase`
//! (the innermost phase open at `t_ns`, derived from the markers at seal time) and
//! then [`SAMPLE_COLUMNS`] in this order. Each column's `unit`, `window` and `source`
//! are stored in the Parquet schema's field metadata.

/// How a column is stored in Parquet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// 64-bit signed integer (bytes, counts, MHz, mW).
    I64,
    /// 64-bit float (percentages, cores, load).
    F64,
}

/// One sampler column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSpec {
    /// Column name, with its unit as suffix.
    pub name: &'static str,
    /// Storage type.
    pub ty: ColumnType,
    /// Unit of the value.
    pub unit: &'static str,
    /// Over what time the value is averaged or accumulated by its source.
    pub window: &'static str,
    /// Where the value comes from.
    pub source: &'static str,
}

const fn col(
    name: &'static str,
    ty: ColumnType,
    unit: &'static str,
    window: &'static str,
    source: &'static str,
) -> ColumnSpec {
    ColumnSpec {
        name,
        ty,
        unit,
        window,
        source,
    }
}

use ColumnType::{F64, I64};

/// The sampler's columns, in storage order.
pub const SAMPLE_COLUMNS: &[ColumnSpec] = &[
    // GPU (NVML, device 0), fast tick.
    col(
        "gpu_util_pct",
        F64,
        "percent",
        "driver: share of time a kernel ran over the previous 1/6 s to 1 s",
        "nvml utilization_rates.gpu",
    ),
    col(
        "gpu_mem_util_pct",
        F64,
        "percent",
        "driver: share of time device memory was read or written over the previous 1/6 s to 1 s",
        "nvml utilization_rates.memory",
    ),
    col(
        "gpu_mem_used_bytes",
        I64,
        "bytes",
        "instant",
        "nvml memory_info.used (N/A on unified-memory GPUs)",
    ),
    col(
        "gpu_mem_total_bytes",
        I64,
        "bytes",
        "instant",
        "nvml memory_info.total",
    ),
    col(
        "engine_gpu_mem_bytes",
        I64,
        "bytes",
        "instant",
        "nvml running_compute_processes, summed over the engine's process tree",
    ),
    col(
        "gpu_other_procs",
        I64,
        "count",
        "instant",
        "nvml running_compute_processes outside the engine's process tree",
    ),
    col(
        "gpu_power_mw",
        I64,
        "milliwatts",
        "driver average over about 1 s on recent GPUs",
        "nvml power_usage",
    ),
    col(
        "gpu_sm_clock_mhz",
        I64,
        "MHz",
        "instant",
        "nvml clock_info(SM)",
    ),
    col(
        "gpu_mem_clock_mhz",
        I64,
        "MHz",
        "instant",
        "nvml clock_info(Memory)",
    ),
    col(
        "gpu_temp_c",
        I64,
        "degrees Celsius",
        "instant",
        "nvml temperature(GPU)",
    ),
    // GPU, slow sub-cadence (null on ticks where they were not read).
    col(
        "gpu_energy_mj",
        I64,
        "millijoules",
        "cumulative since driver load; read on the slow sub-cadence",
        "nvml total_energy_consumption",
    ),
    col(
        "gpu_pcie_tx_kibps",
        I64,
        "KiB/s",
        "driver 20 ms window; read on the slow sub-cadence",
        "nvml pcie_throughput(Send)",
    ),
    col(
        "gpu_pcie_rx_kibps",
        I64,
        "KiB/s",
        "driver 20 ms window; read on the slow sub-cadence",
        "nvml pcie_throughput(Receive)",
    ),
    // The engine's process tree (procfs), summed over processes.
    col(
        "rss_bytes",
        I64,
        "bytes",
        "instant",
        "procfs status VmRSS, process tree sum",
    ),
    col(
        "rss_anon_bytes",
        I64,
        "bytes",
        "instant",
        "procfs status RssAnon, process tree sum",
    ),
    col(
        "rss_file_bytes",
        I64,
        "bytes",
        "instant",
        "procfs status RssFile, process tree sum",
    ),
    col(
        "rss_shmem_bytes",
        I64,
        "bytes",
        "instant",
        "procfs status RssShmem, process tree sum",
    ),
    col(
        "vm_hwm_bytes",
        I64,
        "bytes",
        "since process start",
        "procfs status VmHWM, process tree sum",
    ),
    col(
        "cpu_cores",
        F64,
        "cores",
        "since the previous tick",
        "procfs stat utime+stime delta over tick interval, process tree",
    ),
    col(
        "threads",
        I64,
        "count",
        "instant",
        "procfs stat num_threads, process tree sum",
    ),
    col(
        "read_bytes",
        I64,
        "bytes",
        "cumulative since process start",
        "procfs io read_bytes, process tree sum",
    ),
    col(
        "write_bytes",
        I64,
        "bytes",
        "cumulative since process start",
        "procfs io write_bytes, process tree sum",
    ),
    // The system.
    col(
        "mem_available_bytes",
        I64,
        "bytes",
        "instant",
        "/proc/meminfo MemAvailable",
    ),
    col(
        "cached_bytes",
        I64,
        "bytes",
        "instant",
        "/proc/meminfo Cached",
    ),
    col(
        "dirty_bytes",
        I64,
        "bytes",
        "instant",
        "/proc/meminfo Dirty",
    ),
    col(
        "psi_mem_some_avg10_pct",
        F64,
        "percent",
        "kernel 10 s average",
        "/proc/pressure/memory some avg10",
    ),
    col(
        "psi_mem_full_avg10_pct",
        F64,
        "percent",
        "kernel 10 s average",
        "/proc/pressure/memory full avg10",
    ),
    col(
        "load1",
        F64,
        "runnable tasks",
        "kernel 1 min exponential average",
        "/proc/loadavg",
    ),
    // Page-cache residency of the run's weight files (about once a second).
    col(
        "weights_cached_bytes",
        I64,
        "bytes",
        "instant; read about once a second",
        "mincore over the weight files",
    ),
    // The modelled unified-memory footprint the watchdog budgets.
    col(
        "unified_bytes",
        I64,
        "bytes",
        "instant",
        "rss_bytes + weights_cached_bytes + engine_gpu_mem_bytes (latest readings)",
    ),
    // The instrument itself.
    col(
        "harness_cpu_cores",
        F64,
        "cores",
        "since the previous tick",
        "procfs stat of the harness process",
    ),
    col(
        "tick_lag_ns",
        I64,
        "nanoseconds",
        "instant",
        "how late this tick fired against its schedule",
    ),
];

/// The index of column `name` in [`SAMPLE_COLUMNS`].
pub fn column_index(name: &str) -> Option<usize> {
    SAMPLE_COLUMNS.iter().position(|c| c.name == name)
}

/// One sampler row: a timestamp and one optional value per [`SAMPLE_COLUMNS`] entry.
///
/// Integer columns hold integral values in `f64` (exact below 2^53).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// CLOCK_MONOTONIC nanoseconds at which the row was taken.
    pub t_ns: u64,
    /// One value per column of [`SAMPLE_COLUMNS`]; `None` is unavailable.
    pub values: Vec<Option<f64>>,
}

impl Sample {
    /// A row at `t_ns` with every value unavailable.
    pub fn empty(t_ns: u64) -> Self {
        Sample {
            t_ns,
            values: vec![None; SAMPLE_COLUMNS.len()],
        }
    }

    /// Set column `name`; unknown names are a programming error reported as `false`.
    pub fn set(&mut self, name: &str, value: Option<f64>) -> bool {
        match column_index(name) {
            Some(i) => {
                self.values[i] = value;
                true
            }
            None => false,
        }
    }

    /// The value of column `name`, if known and available.
    pub fn get(&self, name: &str) -> Option<f64> {
        column_index(name).and_then(|i| self.values.get(i).copied().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn column_names_are_unique_and_carry_units() {
        let mut seen = HashSet::new();
        for c in SAMPLE_COLUMNS {
            assert!(seen.insert(c.name), "duplicate column {}", c.name);
            assert!(!c.unit.is_empty() && !c.window.is_empty() && !c.source.is_empty());
        }
        assert!(!seen.contains("t_ns") && !seen.contains("phase"));
    }

    #[test]
    fn set_and_get_round_trip_and_unknown_is_refused() {
        let mut s = Sample::empty(7);
        assert!(s.set("rss_bytes", Some(4096.0)));
        assert!(!s.set("no_such_column", Some(1.0)));
        assert_eq!(s.get("rss_bytes"), Some(4096.0));
        assert_eq!(s.get("gpu_util_pct"), None);
    }
}
