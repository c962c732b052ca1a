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

/// The sampler's column names, one constant each: the one spelling the sampler
/// (writer), the schema and every reader use. Units and windows are in
/// [`SAMPLE_COLUMNS`].
pub mod column {
    /// `gpu_util_pct`.
    pub const GPU_UTIL_PCT: &str = "gpu_util_pct";
    /// `gpu_mem_util_pct`.
    pub const GPU_MEM_UTIL_PCT: &str = "gpu_mem_util_pct";
    /// `gpu_mem_used_bytes`.
    pub const GPU_MEM_USED_BYTES: &str = "gpu_mem_used_bytes";
    /// `gpu_mem_total_bytes`.
    pub const GPU_MEM_TOTAL_BYTES: &str = "gpu_mem_total_bytes";
    /// `engine_gpu_mem_bytes`.
    pub const ENGINE_GPU_MEM_BYTES: &str = "engine_gpu_mem_bytes";
    /// `gpu_other_procs`.
    pub const GPU_OTHER_PROCS: &str = "gpu_other_procs";
    /// `gpu_power_mw`.
    pub const GPU_POWER_MW: &str = "gpu_power_mw";
    /// `gpu_sm_clock_mhz`.
    pub const GPU_SM_CLOCK_MHZ: &str = "gpu_sm_clock_mhz";
    /// `gpu_mem_clock_mhz`.
    pub const GPU_MEM_CLOCK_MHZ: &str = "gpu_mem_clock_mhz";
    /// `gpu_temp_c`.
    pub const GPU_TEMP_C: &str = "gpu_temp_c";
    /// `gpu_energy_mj`.
    pub const GPU_ENERGY_MJ: &str = "gpu_energy_mj";
    /// `gpu_pcie_tx_kibps`.
    pub const GPU_PCIE_TX_KIBPS: &str = "gpu_pcie_tx_kibps";
    /// `gpu_pcie_rx_kibps`.
    pub const GPU_PCIE_RX_KIBPS: &str = "gpu_pcie_rx_kibps";
    /// `gpm_window_start_ns`.
    pub const GPM_WINDOW_START_NS: &str = "gpm_window_start_ns";
    /// `gpm_window_end_ns`.
    pub const GPM_WINDOW_END_NS: &str = "gpm_window_end_ns";
    /// `gpm_sm_active_pct`.
    pub const GPM_SM_ACTIVE_PCT: &str = "gpm_sm_active_pct";
    /// `gpm_sm_occupancy_pct`.
    pub const GPM_SM_OCCUPANCY_PCT: &str = "gpm_sm_occupancy_pct";
    /// `gpm_tensor_active_pct`.
    pub const GPM_TENSOR_ACTIVE_PCT: &str = "gpm_tensor_active_pct";
    /// `gpm_dram_bw_pct`.
    pub const GPM_DRAM_BW_PCT: &str = "gpm_dram_bw_pct";
    /// `gpm_pcie_tx_bytes_per_s`.
    pub const GPM_PCIE_TX_BYTES_PER_S: &str = "gpm_pcie_tx_bytes_per_s";
    /// `gpm_pcie_rx_bytes_per_s`.
    pub const GPM_PCIE_RX_BYTES_PER_S: &str = "gpm_pcie_rx_bytes_per_s";
    /// `rss_bytes`.
    pub const RSS_BYTES: &str = "rss_bytes";
    /// `rss_anon_bytes`.
    pub const RSS_ANON_BYTES: &str = "rss_anon_bytes";
    /// `rss_file_bytes`.
    pub const RSS_FILE_BYTES: &str = "rss_file_bytes";
    /// `rss_shmem_bytes`.
    pub const RSS_SHMEM_BYTES: &str = "rss_shmem_bytes";
    /// `vm_hwm_bytes`.
    pub const VM_HWM_BYTES: &str = "vm_hwm_bytes";
    /// `cpu_cores`.
    pub const CPU_CORES: &str = "cpu_cores";
    /// `threads`.
    pub const THREADS: &str = "threads";
    /// `read_bytes`.
    pub const READ_BYTES: &str = "read_bytes";
    /// `write_bytes`.
    pub const WRITE_BYTES: &str = "write_bytes";
    /// `mem_available_bytes`.
    pub const MEM_AVAILABLE_BYTES: &str = "mem_available_bytes";
    /// `cached_bytes`.
    pub const CACHED_BYTES: &str = "cached_bytes";
    /// `dirty_bytes`.
    pub const DIRTY_BYTES: &str = "dirty_bytes";
    /// `psi_mem_some_avg10_pct`.
    pub const PSI_MEM_SOME_AVG10_PCT: &str = "psi_mem_some_avg10_pct";
    /// `psi_mem_full_avg10_pct`.
    pub const PSI_MEM_FULL_AVG10_PCT: &str = "psi_mem_full_avg10_pct";
    /// `load1`.
    pub const LOAD1: &str = "load1";
    /// `weights_cached_bytes`.
    pub const WEIGHTS_CACHED_BYTES: &str = "weights_cached_bytes";
    /// `unified_bytes`.
    pub const UNIFIED_BYTES: &str = "unified_bytes";
    /// `harness_cpu_cores`.
    pub const HARNESS_CPU_CORES: &str = "harness_cpu_cores";
    /// `tick_lag_ns`.
    pub const TICK_LAG_NS: &str = "tick_lag_ns";
}

/// The sampler's columns, in storage order.
pub const SAMPLE_COLUMNS: &[ColumnSpec] = &[
    // GPU (NVML, device 0), fast tick.
    col(
        column::GPU_UTIL_PCT,
        F64,
        "percent",
        "driver: share of time a kernel ran over the previous 1/6 s to 1 s",
        "nvml utilization_rates.gpu",
    ),
    col(
        column::GPU_MEM_UTIL_PCT,
        F64,
        "percent",
        "driver: share of time device memory was read or written over the previous 1/6 s to 1 s",
        "nvml utilization_rates.memory",
    ),
    col(
        column::GPU_MEM_USED_BYTES,
        I64,
        "bytes",
        "instant",
        "nvml memory_info.used (N/A on unified-memory GPUs)",
    ),
    col(
        column::GPU_MEM_TOTAL_BYTES,
        I64,
        "bytes",
        "instant",
        "nvml memory_info.total",
    ),
    col(
        column::ENGINE_GPU_MEM_BYTES,
        I64,
        "bytes",
        "instant",
        "nvml running_compute_processes, summed over the engine's process tree",
    ),
    col(
        column::GPU_OTHER_PROCS,
        I64,
        "count",
        "instant",
        "nvml running_compute_processes outside the engine's process tree",
    ),
    col(
        column::GPU_POWER_MW,
        I64,
        "milliwatts",
        "driver average over about 1 s on recent GPUs",
        "nvml power_usage",
    ),
    col(
        column::GPU_SM_CLOCK_MHZ,
        I64,
        "MHz",
        "instant",
        "nvml clock_info(SM)",
    ),
    col(
        column::GPU_MEM_CLOCK_MHZ,
        I64,
        "MHz",
        "instant",
        "nvml clock_info(Memory)",
    ),
    col(
        column::GPU_TEMP_C,
        I64,
        "degrees Celsius",
        "instant",
        "nvml temperature(GPU)",
    ),
    // GPU, slow sub-cadence (null on ticks where they were not read).
    col(
        column::GPU_ENERGY_MJ,
        I64,
        "millijoules",
        "cumulative since driver load; read on the slow sub-cadence",
        "nvml total_energy_consumption",
    ),
    col(
        column::GPU_PCIE_TX_KIBPS,
        I64,
        "KiB/s",
        "driver 20 ms window; read on the slow sub-cadence",
        "nvml pcie_throughput(Send)",
    ),
    col(
        column::GPU_PCIE_RX_KIBPS,
        I64,
        "KiB/s",
        "driver 20 ms window; read on the slow sub-cadence",
        "nvml pcie_throughput(Receive)",
    ),
    // The engine's process tree (procfs), summed over processes.
    col(
        column::RSS_BYTES,
        I64,
        "bytes",
        "instant",
        "procfs status VmRSS, process tree sum",
    ),
    col(
        column::RSS_ANON_BYTES,
        I64,
        "bytes",
        "instant",
        "procfs status RssAnon, process tree sum",
    ),
    col(
        column::RSS_FILE_BYTES,
        I64,
        "bytes",
        "instant",
        "procfs status RssFile, process tree sum",
    ),
    col(
        column::RSS_SHMEM_BYTES,
        I64,
        "bytes",
        "instant",
        "procfs status RssShmem, process tree sum",
    ),
    col(
        column::VM_HWM_BYTES,
        I64,
        "bytes",
        "since process start",
        "procfs status VmHWM, process tree sum",
    ),
    col(
        column::CPU_CORES,
        F64,
        "cores",
        "since the previous tick",
        "procfs stat utime+stime delta over tick interval, process tree",
    ),
    col(
        column::THREADS,
        I64,
        "count",
        "instant",
        "procfs stat num_threads, process tree sum",
    ),
    col(
        column::READ_BYTES,
        I64,
        "bytes",
        "cumulative since process start",
        "procfs io read_bytes, process tree sum",
    ),
    col(
        column::WRITE_BYTES,
        I64,
        "bytes",
        "cumulative since process start",
        "procfs io write_bytes, process tree sum",
    ),
    // The system.
    col(
        column::MEM_AVAILABLE_BYTES,
        I64,
        "bytes",
        "instant",
        "/proc/meminfo MemAvailable",
    ),
    col(
        column::CACHED_BYTES,
        I64,
        "bytes",
        "instant",
        "/proc/meminfo Cached",
    ),
    col(
        column::DIRTY_BYTES,
        I64,
        "bytes",
        "instant",
        "/proc/meminfo Dirty",
    ),
    col(
        column::PSI_MEM_SOME_AVG10_PCT,
        F64,
        "percent",
        "kernel 10 s average",
        "/proc/pressure/memory some avg10",
    ),
    col(
        column::PSI_MEM_FULL_AVG10_PCT,
        F64,
        "percent",
        "kernel 10 s average",
        "/proc/pressure/memory full avg10",
    ),
    col(
        column::LOAD1,
        F64,
        "runnable tasks",
        "kernel 1 min exponential average",
        "/proc/loadavg",
    ),
    // Page-cache residency of the run's weight files (about once a second).
    col(
        column::WEIGHTS_CACHED_BYTES,
        I64,
        "bytes",
        "instant; read about once a second",
        "mincore over the weight files",
    ),
    // The modelled unified-memory footprint the watchdog budgets.
    col(
        column::UNIFIED_BYTES,
        I64,
        "bytes",
        "instant",
        "rss_bytes + weights_cached_bytes + engine_gpu_mem_bytes (latest readings)",
    ),
    // The instrument itself.
    col(
        column::HARNESS_CPU_CORES,
        F64,
        "cores",
        "since the previous tick",
        "procfs stat of the harness process",
    ),
    col(
        column::TICK_LAG_NS,
        I64,
        "nanoseconds",
        "instant",
        "how late this tick fired against its schedule",
    ),
    // Appended last, so journals of the layout before them read as a prefix
    // (see `PREFIX_LAYOUTS`).
    // NVML's GPU Performance Monitoring (Hopper and later): metrics over a window
    // between two GPM samples, read on a thread of its own; each window lands
    // once, in the first row after it closes, with its own bounds.
    col(
        column::GPM_WINDOW_START_NS,
        I64,
        "nanoseconds (CLOCK_MONOTONIC)",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "the harness's clock at the window's first GPM sample",
    ),
    col(
        column::GPM_WINDOW_END_NS,
        I64,
        "nanoseconds (CLOCK_MONOTONIC)",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "the harness's clock at the window's second GPM sample",
    ),
    col(
        column::GPM_SM_ACTIVE_PCT,
        F64,
        "percent",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_SM_UTIL (time each SM had a warp assigned, averaged over SMs)",
    ),
    col(
        column::GPM_SM_OCCUPANCY_PCT,
        F64,
        "percent",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_SM_OCCUPANCY (resident warps against the maximum, averaged over SMs)",
    ),
    col(
        column::GPM_TENSOR_ACTIVE_PCT,
        F64,
        "percent",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_ANY_TENSOR_UTIL (time the SMs' tensor pipes were busy)",
    ),
    col(
        column::GPM_DRAM_BW_PCT,
        F64,
        "percent",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_DRAM_BW_UTIL (DRAM bandwidth used against the peak)",
    ),
    col(
        column::GPM_PCIE_TX_BYTES_PER_S,
        F64,
        "bytes/s",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    ),
    col(
        column::GPM_PCIE_RX_BYTES_PER_S,
        F64,
        "bytes/s",
        "the GPM window [gpm_window_start_ns, gpm_window_end_ns] (at least 100 ms); set only on the first row after the window closes, null on the others",
        "nvml gpm NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    ),
];

/// Column counts of earlier layouts whose columns are, in order, the first
/// columns of [`SAMPLE_COLUMNS`]: a journal written with one of them (by a harness
/// from before the columns after it were appended) still reads, its rows padded
/// with nulls. Today: the layout before the eight GPM columns.
pub const PREFIX_LAYOUTS: &[usize] = &[SAMPLE_COLUMNS.len() - 8];

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
