//! `harness run`'s preflight: every gate before the engine starts, in order, each
//! one function. Each records its gate (and its fragments) through the
//! [`Session`]; a refusal, or a signal that arrived meanwhile, stops the run
//! before the engine with a bundle that says why.
//!
//! Order: lease, device, engine binary (H5), weights, the weights' page-cache
//! state, the engine's command line, the watchdog's limits, contention, headroom,
//! then the watchdog's positive control (H1) and the GPU control.

use evidence::fragments as frag;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use evidence::store::{Staging, Store};

use crate::control::watchdog::{self as watchdog_control, ControlKind};
use crate::exit::Refusal;
use crate::gate_verdict::{Gate, Verdict};
use crate::run::config::{Engine, RunConfig};
use crate::run::gate_checks::{self, CopiedBinary};
use crate::run::session::Session;
use crate::run::signals::Signals;
use crate::run::{facts, spawn};
use crate::sampler::gpu::Gpu;
use crate::sampler::limits::{default_floor, Limits};
use crate::weights::{self, Weights};
use crate::weights_cache::Policy as WeightsCache;

/// Everything preflight established.
pub(super) struct Ready {
    /// The engine's program (its copy in the store) and arguments.
    pub(super) command: spawn::EngineCommand,
    /// The run's weights, when it names any.
    pub(super) weights: Option<Weights>,
    /// The watchdog's limits.
    pub(super) limits: Limits,
    /// The GPU, when NVML opened one.
    pub(super) gpu: Option<Arc<Gpu>>,
    /// Why there is no GPU, when there is none.
    pub(super) gpu_reason: Option<String>,
    /// The `engine` fragment as recorded before the start (completed with the
    /// engine's name and version once it ends).
    pub(super) engine_fragment: frag::Engine,
    /// The `contention` fragment as judged before the start (completed with
    /// `during` once the engine is reaped).
    pub(super) contention: frag::Contention,
    /// What an `--exec` engine's run depends on, pinned before the start and
    /// checked again after the end (`run/pinned.rs`); None for `--engine`.
    pub(super) pinned: Option<crate::run::pinned::Pinned>,
}

/// How preflight ended without an engine.
pub(super) enum Stopped {
    /// A gate refused.
    Refused(Refusal),
    /// A signal (`SIGINT`, `SIGTERM`) arrived.
    Interrupted(&'static str),
}

impl Stopped {
    /// What ended the run before its engine started, given the signal (if any)
    /// that arrived meanwhile: a gate's refusal while a SIGTERM or SIGINT came in
    /// is an interruption, since the signal reaches the gate's own child
    /// processes too (Slurm's `scancel` signals the whole job step: the weights
    /// gate's `synth-weights` then dies of it and the gate refuses). The gate's
    /// verdict stays in the manifest's `gates`; the exit names both.
    pub(super) fn exit(self, late: Option<&'static str>) -> (crate::classify::Exit, u8) {
        use crate::classify::{refused, Exit, Reason};
        let interrupted = |detail: String| Exit {
            reason: Reason::Interrupted,
            code: None,
            signal: None,
            detail,
            open_phases: vec![],
        };
        match (self, late) {
            (Stopped::Refused(r), None) => (refused(&r.gate, &r.why), crate::exit::REFUSED),
            (Stopped::Refused(r), Some(sig)) => (
                interrupted(format!(
                    "harness received {sig} before the engine started (gate '{}' refused \
                     meanwhile: {})",
                    r.gate, r.why
                )),
                crate::exit::NEGATIVE,
            ),
            (Stopped::Interrupted(sig), _) => (
                interrupted(format!("harness received {sig} before the engine started")),
                crate::exit::NEGATIVE,
            ),
        }
    }
}

/// A preflight step's result: its value, or why the run stops before the engine;
/// `Err` when the harness itself failed.
type Step<T> = anyhow::Result<Result<T, Stopped>>;

/// The value of a [`Step`], or the end of preflight with its stop.
macro_rules! step {
    ($e:expr) => {
        match $e? {
            Ok(v) => v,
            Err(stop) => return Ok(Err(stop)),
        }
    };
}

/// Record gate `g`; stop on its refusal, or on a signal that arrived meanwhile.
fn pass(s: &mut Session, g: Gate, signals: &Signals) -> Step<()> {
    if let Err(r) = s.gate(g)? {
        return Ok(Err(Stopped::Refused(r)));
    }
    if let Some(sig) = signals.take() {
        return Ok(Err(Stopped::Interrupted(sig)));
    }
    Ok(Ok(()))
}

/// Record the refusal of gate `name` with `why`, and stop.
fn refuse<T>(s: &mut Session, name: &str, why: String) -> Step<T> {
    let r = Refusal {
        gate: name.to_string(),
        why,
    };
    let _ = s.gate(Gate::new(name, Verdict::Refuse, r.why.clone()))?;
    Ok(Err(Stopped::Refused(r)))
}

/// Run every preflight gate in order.
pub(super) fn preflight(
    s: &mut Session,
    config: &RunConfig,
    store: &Store,
    staging: &Staging,
    rung_copy: Option<&Path>,
    signals: &Signals,
) -> Step<Ready> {
    step!(lease(s, config, signals));
    let (gpu, gpu_reason) = step!(device(s, config, signals));
    let (copied, pinned) = step!(engine_binary(s, config, store, signals));
    let exec = pinned.is_some();
    let weights = step!(weights(s, config, store, &copied, signals));
    step!(weights_cache(s, config, weights.as_ref(), signals));
    let command = engine_command(config, staging, rung_copy, weights.as_ref())?;
    let engine_fragment = frag::Engine {
        sha256: Some(copied.sha256.clone()),
        version: None,
        name: None,
        store_path: (!exec).then(|| copied.store_path.clone()),
        source_path: Some(copied.source.clone()),
        args: Some(command.clone()),
        exec: Some(exec),
        run_path: pinned.as_ref().map(|_| copied.store_path.clone()),
        pinned: pinned.as_ref().map(serde_json::to_value).transpose()?,
        rest: serde_json::Map::new(),
    };
    s.record(&engine_fragment)?;
    let (limits, unified_gpu) = watchdog_limits(s, config, gpu.as_deref())?;
    let contention = step!(contention(s, config, gpu.as_deref(), signals));
    step!(headroom(
        s,
        config,
        rung_copy,
        &copied,
        limits.mem_floor_bytes,
        unified_gpu,
        signals
    ));
    step!(controls(
        s,
        config,
        store,
        &limits,
        gpu.as_deref(),
        gpu_reason.as_deref(),
        signals
    ));
    Ok(Ok(Ready {
        command: spawn::EngineCommand {
            program: copied.store_path.clone(),
            args: command.iter().map(Into::into).collect(),
        },
        weights,
        limits,
        gpu,
        gpu_reason,
        engine_fragment,
        contention,
        pinned,
    }))
}

/// H3: a rung that requires a lease refuses without one; the `lease` fragment
/// records the id either way, and the Slurm node the run is on where Slurm says.
fn lease(s: &mut Session, config: &RunConfig, signals: &Signals) -> Step<()> {
    let lease_required = config.rung.as_ref().is_some_and(|(_, r)| r.require.lease);
    step!(pass(
        s,
        gate_checks::lease(lease_required, config.lease_id.as_deref()),
        signals
    ));
    match config
        .lease_id
        .as_deref()
        .map(str::trim)
        .filter(|x| !x.is_empty())
    {
        Some(id) => s.record(&frag::Lease {
            id: id.to_string(),
            node: config.lease_node.clone(),
        })?,
        // No lease: the fragment is null.
        None => s.record_null::<frag::Lease>()?,
    }
    Ok(Ok(()))
}

/// The GPU (NVML, opened once per run) and the `gpu` fragment. A CUDA rung on a
/// machine with no usable GPU is refused here, before minutes of weight synthesis
/// and an engine that would fail at its first device call.
fn device(
    s: &mut Session,
    config: &RunConfig,
    signals: &Signals,
) -> Step<(Option<Arc<Gpu>>, Option<String>)> {
    let (gpu, gpu_reason) = match Gpu::open(0) {
        Ok(g) => (Some(Arc::new(g)), None),
        Err(why) => (None, Some(why)),
    };
    match &gpu {
        Some(g) => s.record(&g.facts())?,
        None => s.record_null::<frag::Gpu>()?,
    }
    if let Some((file, r)) = &config.rung {
        match (r.device, &gpu, &gpu_reason) {
            (evidence::rung::Device::Cuda, None, Some(why)) => {
                return refuse(s, "device", gate_checks::no_gpu_for_cuda(file, why));
            }
            (evidence::rung::Device::Cuda, Some(g), _) => {
                step!(pass(
                    s,
                    Gate::new(
                        "device",
                        Verdict::Pass,
                        format!("cuda rung; NVML opened GPU {}", g.index())
                    ),
                    signals
                ));
            }
            _ => {}
        }
    }
    Ok(Ok((gpu, gpu_reason)))
}

/// H5: the engine runs from the store under its hash. Returns the copy and
/// whether the engine is an `--exec` program.
fn engine_binary(
    s: &mut Session,
    config: &RunConfig,
    store: &Store,
    signals: &Signals,
) -> Step<(CopiedBinary, Option<crate::run::pinned::Pinned>)> {
    let found = match &config.engine {
        Engine::Render { binary } if !binary.is_file() => Err(format!(
            "{}: no such engine binary (build it, or pass --engine PATH)",
            binary.display()
        )),
        // The engine of this repository: copied into the store (H5).
        Engine::Render { binary } => {
            gate_checks::copy_engine(binary, &store.bin_dir()).map(|c| (c, None))
        }
        // Any other engine runs in place, as the user would run it, pinned.
        Engine::Exec { program, args } => match gate_checks::resolve_program(program) {
            None => Err(gate_checks::why_unresolved(program)),
            Some(path) => crate::run::pinned::pin(program, &path, args).map(|p| {
                let c = CopiedBinary {
                    source: p.files[0].resolved.clone(),
                    store_path: path.clone(),
                    sha256: p.files[0].sha256.clone().unwrap_or_default(),
                };
                (c, Some(p))
            }),
        },
    };
    match found {
        Ok((c, pinned)) => {
            let detail = match &pinned {
                None => format!(
                    "{} copied to {} (sha256 {})",
                    c.source.display(),
                    c.store_path.display(),
                    c.sha256
                ),
                Some(p) => format!(
                    "{} runs in place (resolves to {}, sha256 {}); {} file(s) pinned{}",
                    c.store_path.display(),
                    c.source.display(),
                    c.sha256,
                    p.files.len(),
                    match p.python.as_ref().and_then(|v| v.get("prefix")) {
                        Some(prefix) => format!(", python prefix {prefix}"),
                        None => String::new(),
                    }
                ),
            };
            step!(pass(
                s,
                Gate::new("engine-binary", Verdict::Pass, detail),
                signals
            ));
            Ok(Ok((c, pinned)))
        }
        Err(why) => refuse(s, "engine-binary", why),
    }
}

/// The weights: given, or synthesized once into the store's cache by the engine
/// (a rung run); the `weights` fragment (null when the run names none).
fn weights(
    s: &mut Session,
    config: &RunConfig,
    store: &Store,
    copied: &CopiedBinary,
    signals: &Signals,
) -> Step<Option<Weights>> {
    let rung = config.rung.as_ref().map(|(_, r)| r);
    let weights = match (&config.weights, &config.engine, rung) {
        (Some(dir), _, _) => Some(weights::describe(dir, false)),
        (None, Engine::Render { .. }, Some(r)) => {
            eprintln!(
                "harness: weights for preset {:?} (synthesized once into the store cache)",
                r.preset
            );
            Some(weights::synthesize(
                &copied.store_path,
                &r.preset,
                &store.cache_dir(),
            ))
        }
        _ => None,
    };
    match weights {
        Some(Ok(w)) => {
            step!(pass(
                s,
                Gate::new(
                    "weights",
                    Verdict::Pass,
                    format!(
                        "{} ({}, {} files)",
                        w.digest,
                        w.dir.display(),
                        w.files.len()
                    )
                ),
                signals
            ));
            s.record(&w.fragment())?;
            Ok(Ok(Some(w)))
        }
        Some(Err(e)) => refuse(s, "weights", e.to_string()),
        None => {
            s.record_null::<frag::Weights>()?;
            Ok(Ok(None))
        }
    }
}

/// The weights' page-cache state at engine start (`as-is` only records it; `cold`
/// and `warm` set it), as the `weights_cache` fragment and gate.
fn weights_cache(
    s: &mut Session,
    config: &RunConfig,
    weights: Option<&Weights>,
    signals: &Signals,
) -> Step<()> {
    match (weights, config.weights_cache) {
        (Some(w), policy) => match crate::weights_cache::prepare(&w.paths(), policy) {
            Ok(p) => {
                // The figures as numbers too: rank pairs weight-reading metrics
                // only between runs that started in about the same cache state.
                s.record(&p.fragment())?;
                step!(pass(s, p.gate(), signals));
            }
            Err(e) if policy == WeightsCache::AsIs => {
                step!(pass(
                    s,
                    Gate::new(
                        "weights-cache",
                        Verdict::NotApplicable,
                        format!("as-is: {e}")
                    ),
                    signals
                ));
            }
            Err(e) => return refuse(s, "weights-cache", e.to_string()),
        },
        (None, WeightsCache::AsIs) => {}
        (None, policy) => {
            return refuse(
                s,
                "weights-cache",
                format!(
                    "--weights-cache {}: this run names no weight files (give --weights, or run a rung)",
                    policy.as_str()
                ),
            )
        }
    }
    Ok(Ok(()))
}

/// The engine's command line: `render` with the staged rung copy, the weights, the
/// frames directory, the levers, the profile and the device; or the `--exec`
/// program's own arguments.
fn engine_command(
    config: &RunConfig,
    staging: &Staging,
    rung_copy: Option<&Path>,
    weights: Option<&Weights>,
) -> anyhow::Result<Vec<String>> {
    let rung = config.rung.as_ref().map(|(_, r)| r);
    Ok(match &config.engine {
        Engine::Render { .. } => {
            let (Some(rung_copy), Some(r), Some(w)) = (rung_copy, rung, weights) else {
                anyhow::bail!("internal: a render run without rung or weights");
            };
            let mut a: Vec<String> = vec![
                "render".into(),
                "--rung".into(),
                rung_copy.display().to_string(),
                "--weights".into(),
                w.dir.display().to_string(),
                "--out".into(),
                staging.frames_dir().display().to_string(),
            ];
            a.extend(lever_args(config));
            a.push("--device".into());
            a.push(
                serde_json::to_value(r.device)?
                    .as_str()
                    .unwrap_or("cpu")
                    .to_string(),
            );
            a
        }
        Engine::Exec { args, .. } => args.clone(),
    })
}

/// The watchdog's limits (H1): the MemAvailable floor (`--mem-floor`, else the
/// default for this machine) and, on a unified-memory GPU or when asked, the
/// unified budget; the `watchdog` fragment. Returns the limits and whether the GPU
/// shares host memory.
fn watchdog_limits(
    s: &mut Session,
    config: &RunConfig,
    gpu: Option<&Gpu>,
) -> anyhow::Result<(Limits, bool)> {
    let mem_total = crate::sampler::system::mem_total_bytes().map_err(anyhow::Error::msg)?;
    let floor = config.mem_floor.unwrap_or_else(|| default_floor(mem_total));
    let unified_gpu = gpu.is_some_and(|g| g.unified_memory());
    let budget = config
        .unified_budget
        .or_else(|| unified_gpu.then(|| mem_total.saturating_sub(floor)));
    let limits = Limits {
        mem_floor_bytes: floor,
        unified_budget_bytes: budget,
    };
    s.record(&limits.fragment(None))?;
    Ok((limits, unified_gpu))
}

/// Contention at the start: recorded and flagged, never refused. With
/// `--quiet-wait-s`, a busy host is read again, window after window, until it
/// is quiet or the wait is spent; the gate judges the last window and the
/// fragment says how long the run waited. Returns the `contention` fragment.
fn contention(
    s: &mut Session,
    config: &RunConfig,
    gpu: Option<&Gpu>,
    signals: &Signals,
) -> Step<frag::Contention> {
    let window = Duration::from_millis(gate_checks::CONTENTION_WINDOW_MS);
    let limit = gate_checks::contention_limit(facts::cores());
    let max_retries = (config.quiet_wait_s / window.as_secs_f64()).ceil() as u64;
    let t0 = std::time::Instant::now();
    let q = gate_checks::quiet_start(
        || gate_checks::busy_cores(window),
        limit,
        max_retries,
        || signals.take(),
    );
    let waited_s = (t0.elapsed().as_secs_f64() - window.as_secs_f64()).max(0.0);
    let load1 = crate::sampler::system::load1().ok();
    let mut c = gate_checks::contention(q.busy, load1, facts::cores(), gpu, std::process::id());
    if config.quiet_wait_s > 0.0 {
        c.quiet_wait_s = Some((waited_s * 10.0).round() / 10.0);
        c.quiet_wait_limit_s = Some(config.quiet_wait_s);
        let waited = if q.retries == 0 {
            "no wait".to_string()
        } else {
            format!(
                "after {waited_s:.1} s of waiting for a quiet host (at most {} s)",
                config.quiet_wait_s
            )
        };
        c.detail = c.detail.map(|d| format!("{d}; {waited}"));
    }
    let flagged = c.flagged.unwrap_or(false);
    let detail = c.detail.clone().unwrap_or_default();
    s.record(&c)?;
    step!(pass(
        s,
        Gate::new(
            "contention",
            Verdict::Pass,
            if flagged {
                format!("FLAGGED: {detail}")
            } else {
                detail
            }
        ),
        signals
    ));
    // A signal that stopped the wait was taken from the flags: the gate is
    // recorded first, then the run stops as `pass` would have stopped it.
    if let Some(sig) = q.interrupted {
        return Ok(Err(Stopped::Interrupted(sig)));
    }
    Ok(Ok(c))
}

/// Headroom: a render's projected peak (the engine's memory projection, `engine
/// plan`) fits in MemAvailable above the `floor` (bytes); an `--exec` engine has
/// no projection, so only the floor
/// itself is checked.
fn headroom(
    s: &mut Session,
    config: &RunConfig,
    rung_copy: Option<&Path>,
    copied: &CopiedBinary,
    floor: u64,
    unified_gpu: bool,
    signals: &Signals,
) -> Step<()> {
    let avail = crate::sampler::system::mem_available_bytes().map_err(anyhow::Error::msg)?;
    match &config.engine {
        Engine::Render { .. } => {
            let mut pa = vec![
                "--rung".to_string(),
                rung_copy
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ];
            pa.extend(lever_args(config));
            match gate_checks::engine_projection(&copied.store_path, &pa) {
                Ok(p) => pass(
                    s,
                    gate_checks::headroom(&p, avail, floor, unified_gpu),
                    signals,
                ),
                Err(why) => refuse(s, "headroom", format!("no projection to check: {why}")),
            }
        }
        Engine::Exec { .. } => {
            if avail < floor {
                return refuse(
                    s,
                    "headroom",
                    format!("MemAvailable {avail} B is already below the floor {floor} B"),
                );
            }
            pass(
                s,
                Gate::new(
                    "headroom",
                    Verdict::NotApplicable,
                    format!("--exec engines have no plan; MemAvailable {avail} B, floor {floor} B"),
                ),
                signals,
            )
        }
    }
}

/// H1: the watchdog must be seen to fire before the engine is trusted to it (the
/// floor, and the unified budget when armed); then the GPU control.
fn controls(
    s: &mut Session,
    config: &RunConfig,
    store: &Store,
    limits: &Limits,
    gpu: Option<&Gpu>,
    gpu_reason: Option<&str>,
    signals: &Signals,
) -> Step<()> {
    let me: PathBuf = std::env::current_exe().context("locating the harness binary")?;
    let mut kinds = vec![ControlKind::Floor];
    if limits.unified_budget_bytes.is_some() {
        kinds.push(ControlKind::UnifiedBudget);
    }
    for kind in kinds {
        let c = watchdog_control::control(&me, kind, config.cadence_ms, limits.mem_floor_bytes);
        let (passed, name, detail) = (c.passed(), c.name.clone(), c.detail.clone());
        s.control(c)?;
        step!(pass(
            s,
            Gate::new(
                "watchdog-control",
                if passed {
                    Verdict::Pass
                } else {
                    Verdict::Refuse
                },
                format!("{name}: {detail}")
            ),
            signals
        ));
    }
    s.control(crate::control::recorded::for_run(store, gpu, gpu_reason))?;
    Ok(Ok(()))
}

/// `--lever K=V`... and `--profile P` for the engine: every lever but those the
/// harness applies itself ([`crate::harness_levers`]), which the engine never sees.
pub(super) fn lever_args(config: &RunConfig) -> Vec<String> {
    let mut a = Vec::new();
    for (k, v) in config
        .levers
        .iter()
        .filter(|(k, _)| !crate::harness_levers::applies(k))
    {
        a.push("--lever".into());
        a.push(format!("{k}={v}"));
    }
    a.push("--profile".into());
    a.push(config.profile.clone());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red on: a refusal with a signal in flight classified as `gate-refused`
    /// (the Slurm kill test's cancelled run then reads as refused).
    #[test]
    fn a_refusal_while_a_signal_arrived_is_an_interruption() {
        use crate::classify::Reason;
        let r = || {
            Stopped::Refused(Refusal {
                gate: "weights".into(),
                why: "`synth-weights` failed with signal: 15 (SIGTERM)".into(),
            })
        };
        let (e, code) = r().exit(None);
        assert_eq!(
            (e.reason, code),
            (Reason::GateRefused, crate::exit::REFUSED)
        );
        let (e, code) = r().exit(Some("SIGTERM"));
        assert_eq!(
            (e.reason, code),
            (Reason::Interrupted, crate::exit::NEGATIVE)
        );
        assert!(
            e.detail.contains("SIGTERM") && e.detail.contains("gate 'weights' refused"),
            "{}",
            e.detail
        );
        let (e, _) = Stopped::Interrupted("SIGINT").exit(None);
        assert_eq!(e.reason, Reason::Interrupted);
    }
}
