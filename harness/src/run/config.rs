//! What `harness run` is to do, validated: the engine, the rung, the levers, the
//! limits and the store, every value checked by the command line.

use std::path::PathBuf;

use evidence::rung::Rung;

/// What runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Engine {
    /// The engine's `render` on the rung.
    Render {
        /// The engine binary as given or defaulted (before the copy-out gate).
        binary: PathBuf,
    },
    /// Any command speaking the protocol.
    Exec {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: Vec<String>,
    },
}

/// A validated run: every flag checked, the rung loaded (see `harness run`'s
/// arguments in [`crate::cmd::run`]).
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The rung file and its contents, when given.
    pub rung: Option<(PathBuf, Rung)>,
    /// The store, when given on the command line.
    pub store: Option<PathBuf>,
    /// Levers: the rung's, then --lever overrides, sorted by lever.
    pub levers: std::collections::BTreeMap<String, String>,
    /// The profile (`default` or `baseline`).
    pub profile: String,
    /// What runs.
    pub engine: Engine,
    /// Explicit weights.
    pub weights: Option<PathBuf>,
    /// Sampler interval, ms.
    pub cadence_ms: u64,
    /// Explicit floor, bytes.
    pub mem_floor: Option<u64>,
    /// Explicit unified budget, bytes.
    pub unified_budget: Option<u64>,
    /// Timeout, seconds.
    pub timeout_s: Option<f64>,
    /// Lease id.
    pub lease_id: Option<String>,
    /// The Slurm node the run is on (`SLURMD_NODENAME`), recorded with the lease.
    pub lease_node: Option<String>,
    /// Observer on.
    pub observer: bool,
    /// The weights' page-cache state at engine start.
    pub weights_cache: crate::weights_cache::Policy,
    /// The most seconds the start gate waits for a quiet host (0: it judges the
    /// first window, as without the flag).
    pub quiet_wait_s: f64,
    /// The campaign schedule fragment, when the run is one position of a campaign.
    pub schedule: Option<serde_json::Value>,
}
