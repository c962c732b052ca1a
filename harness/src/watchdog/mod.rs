//! The memory watchdog (hazard H1 of `specs/device-residency.md`) and its
//! positive control.
//!
//! The watchdog runs inside the sampler: every row is checked against a floor on
//! `MemAvailable` and, on unified-memory machines or when asked, a budget on the
//! modelled unified footprint (`unified_bytes` = engine RSS + weights page cache +
//! engine GPU memory). The first crossing kills the engine's process group with
//! SIGKILL on the spot and is kept as the [`limits::Trip`].
//!
//! The control proves the watchdog fires before any engine is trusted to it: a child
//! (this binary in its hidden `__alloc-probe` mode) allocates past a synthetic limit
//! just below the current reading, and must be killed by the watchdog within two
//! ticks of crossing it. The crossing is judged on the reading the watchdog itself
//! uses: for the floor, the probe re-reads `MemAvailable` after every step (on a
//! virtual machine `MemAvailable` can lag an allocation by hundreds of
//! milliseconds, so the probe's own byte count is not the crossing); for the
//! unified budget, its own RSS, which its byte count is. Controls are serialized
//! machine-wide through a lock file, since two probes at once move each other's
//! `MemAvailable`.
//!
//! * [`limits`]: the limits and their check on one row (what the sampler runs;
//!   depends on nothing else here, so the sampler does not depend on the control).
//! * [`control`]: the positive control, which runs a sampler over the probe.
//!
//! The probe itself is `harness __alloc-probe` ([`crate::cmd::alloc_probe`]).

pub mod control;
pub mod limits;
