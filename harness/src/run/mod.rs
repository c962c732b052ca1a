//! `harness run`: preflight gates, the engine under a sampler and a watchdog, exit
//! classification, the pixel completion check, and the seal.
//!
//! Every run that gets as far as a durable store leaves a bundle: a refused run
//! records the refusal, an interrupted or killed run records every phase it
//! reached and names the open one. Only a refusal of the store itself (H2) leaves
//! nothing, since there is nowhere durable to write.

pub mod args;
pub mod contention;
pub mod facts;
pub mod gates;
pub mod markers;
pub mod signals;
pub mod spawn;
pub mod streams;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use evidence::clock::monotonic_ns;
use evidence::error::StoreError;
use evidence::journal::{Record, SharedJournal, Stream};
use evidence::store::{Staging, Store};

use crate::classify::{self, Facts, Intervention};
use crate::completion::{self, Completion, Expect};
use crate::exit::{self, Refusal};
use crate::sampler::gpu::Gpu;
use crate::sampler::{Reasons, SampleSink, Sampler, SamplerConfig, SamplerReport, Target};
use crate::watchdog::control::{self as watchdog_control, ControlKind, ControlResult};
use crate::watchdog::limits::{default_floor, Limits};
use crate::weights::{self, Weights};
use args::{Engine, RunArgs, RunPlan};
use gates::{Gate, Verdict};
use markers::Live;

/// How long the engine gets between SIGTERM and SIGKILL when the harness stops it.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// How long the output readers get to drain after the engine's group is gone.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the harness looks at the engine, the watchdog and its signals.
const POLL: Duration = Duration::from_millis(20);

/// The journal-backed sink for sampler rows.
struct JournalSink {
    journal: SharedJournal,
    failed: bool,
    /// The live status line, fed every sample (GPU utilization, RSS).
    printer: Option<crate::progress::SharedPrinter>,
    /// Other work per row, judged per phase once the engine is reaped. Locked
    /// by the sampler's thread only until the sampler stops.
    others: Arc<Mutex<contention::TickOthers>>,
}

impl JournalSink {
    fn append(&mut self, r: &Record) {
        if let Err(e) = self.journal.append(r) {
            if !self.failed {
                self.failed = true;
                eprintln!("harness: journal append failed for a sample: {e}");
            }
        }
    }
}

impl SampleSink for JournalSink {
    fn sample(&mut self, s: &evidence::sample::Sample) {
        self.append(&Record::Sample(s.clone()));
        if let Ok(mut o) = self.others.lock() {
            o.on_row(
                s.t_ns,
                contention::TickOthers::host_jiffies(),
                s.get("cpu_cores"),
                s.get("harness_cpu_cores"),
            );
        }
        // try_lock: the sampler carries the watchdog (H1) and must never wait on
        // a terminal; an echo thread blocked on a full stderr holds this lock.
        if let Some(Ok(mut p)) = self.printer.as_ref().map(|p| p.try_lock()) {
            let _ = p.sample(s, monotonic_ns());
        }
    }
    fn unavailable(&mut self, reasons: &Reasons) {
        self.append(&Record::Fragment {
            key: "sensors_unavailable".into(),
            value: reasons.fragment(),
        });
    }
}

/// The run's journal and the gate and control lists written through it.
struct Session {
    journal: SharedJournal,
    gates: Vec<Gate>,
    controls: Vec<ControlResult>,
}

impl Session {
    fn fragment(&self, key: &str, value: serde_json::Value) -> anyhow::Result<()> {
        self.journal
            .append(&Record::Fragment {
                key: key.into(),
                value,
            })
            .with_context(|| format!("writing the '{key}' fragment to the journal"))
    }

    /// Record `g`; a refusal becomes the error that ends preflight.
    fn gate(&mut self, g: Gate) -> anyhow::Result<Result<(), Refusal>> {
        let refusal = (g.verdict == Verdict::Refuse).then(|| Refusal {
            gate: g.name.clone(),
            why: g.detail.clone(),
        });
        eprintln!(
            "harness: gate {:<16} {:<14} {}",
            g.name,
            serde_json::to_value(g.verdict)?.as_str().unwrap_or("?"),
            g.detail
        );
        self.gates.push(g);
        self.fragment("gates", serde_json::to_value(&self.gates)?)?;
        Ok(refusal.map_or(Ok(()), Err))
    }

    fn control(&mut self, c: ControlResult) -> anyhow::Result<()> {
        eprintln!(
            "harness: control {:<24} {:<14} {}",
            c.name, c.verdict, c.detail
        );
        self.controls.push(c);
        self.fragment("controls", serde_json::to_value(&self.controls)?)
    }
}

/// Everything preflight established.
struct Ready {
    command: spawn::EngineCommand,
    weights: Option<Weights>,
    limits: Limits,
    gpu: Option<Arc<Gpu>>,
    gpu_reason: Option<String>,
    engine_fragment: serde_json::Value,
    /// The `contention` fragment as judged before the start (completed with
    /// `during` once the engine is reaped).
    contention: serde_json::Value,
}

/// How preflight ended without an engine.
enum Stopped {
    Refused(Refusal),
    Interrupted(&'static str),
}

/// `harness run`: returns the exit code.
pub fn run(args: &RunArgs) -> anyhow::Result<u8> {
    let plan = args.validate()?;
    let argv: Vec<String> = std::env::args().collect();
    let cwd = std::env::current_dir().unwrap_or_default();
    let start = facts::RunStart::now();
    let start_ns = start.mono_ns;
    let signals = signals::Signals::install().context("installing signal handlers")?;

    // H2: without a durable store there is nowhere to leave a bundle.
    let store = Store::resolve(plan.store.as_deref()).map_err(|e| match e {
        StoreError::Volatile { .. } => anyhow::Error::from(Refusal {
            gate: "store-durable".into(),
            why: e.to_string(),
        }),
        other => anyhow::Error::from(other).context("opening the store"),
    })?;
    let staging = store
        .open_staging()
        .context("opening a staging directory")?;
    let journal =
        SharedJournal::create(&staging.journal_path()).context("creating the run's journal")?;
    eprintln!("harness: staging {}", staging.dir().display());
    let mut s = Session {
        journal: journal.clone(),
        gates: Vec::new(),
        controls: Vec::new(),
    };
    s.fragment("run", facts::run_fragment(start, None, &argv, &cwd))?;
    s.fragment("host", facts::host_fragment())?;
    s.fragment("store", serde_json::json!({"volatile_override": false}))?;
    s.fragment("profile", serde_json::json!(plan.profile))?;
    s.fragment("levers", serde_json::to_value(&plan.levers)?)?;
    if let Some(schedule) = &plan.schedule {
        s.fragment("schedule", schedule.clone())?;
    }
    let sampler_config = SamplerConfig {
        cadence_ms: plan.cadence_ms,
        observer: plan.observer,
        limits: None,
        weights: Vec::new(),
    };
    s.fragment("sampler", sampler_config.fragment())?;
    let rung_copy = match &plan.rung {
        Some((path, rung)) => Some(record_rung(&s, path, rung, &staging)?),
        None => None,
    };
    s.gate(Gate::new(
        "store-durable",
        Verdict::Pass,
        format!("{} is on durable storage", store.root().display()),
    ))?
    .map_err(anyhow::Error::from)?;

    let ready = preflight(
        &mut s,
        &plan,
        &store,
        &staging,
        rung_copy.as_deref(),
        &signals,
    )?;
    let finish = |s: &Session, exit: classify::Exit, completion: Completion, code: u8| {
        conclude(
            s, &store, &staging, start, &argv, &cwd, exit, completion, code,
        )
    };
    let ready = match ready {
        Ok(r) => r,
        Err(Stopped::Refused(r)) => {
            eprintln!("harness: {r}");
            return finish(
                &s,
                classify::refused(&r.gate, &r.why),
                Completion::not_checked("the engine never started"),
                exit::REFUSED,
            );
        }
        Err(Stopped::Interrupted(sig)) => {
            let e = classify::Exit {
                reason: classify::Reason::Interrupted,
                code: None,
                signal: None,
                detail: format!("harness received {sig} before the engine started"),
                open_phases: vec![],
            };
            return finish(
                &s,
                e,
                Completion::not_checked("the engine never started"),
                exit::NEGATIVE,
            );
        }
    };

    // The engine.
    let frames_dir = staging.frames_dir();
    std::fs::create_dir_all(&frames_dir)
        .with_context(|| format!("creating {}", frames_dir.display()))?;
    let mut config = sampler_config;
    config.limits = Some(ready.limits.clone());
    config.weights = ready
        .weights
        .as_ref()
        .map(Weights::paths)
        .unwrap_or_default();
    let cpu_start = contention::CpuMark::now();
    let running = match spawn::spawn(&ready.command, &frames_dir) {
        Ok(r) => r,
        Err(e) => {
            let exit = classify::Exit {
                reason: classify::Reason::EngineFailed,
                code: None,
                signal: None,
                detail: format!("could not start {}: {e}", ready.command.program.display()),
                open_phases: vec![],
            };
            let c = Completion::not_checked("the engine never started");
            return finish(&s, exit, c, exit::NEGATIVE);
        }
    };
    let pid = running.pid;
    eprintln!("harness: engine pid {pid} started");
    let live = Arc::new(Mutex::new(Live::default()));
    // The live status (open phase, step k/N, ETA, GPU utilization, RSS): redrawn in
    // place on a terminal, one line per event otherwise.
    let style = match crate::progress::Style::for_stderr() {
        crate::progress::Style::Redraw => crate::progress::Style::Redraw,
        _ => crate::progress::Style::Heartbeat,
    };
    let printer: crate::progress::SharedPrinter = Arc::new(Mutex::new(
        crate::progress::Printer::new(std::io::stderr(), style, monotonic_ns()),
    ));
    let readers: Vec<JoinHandle<()>> = vec![markers::read_markers(
        running.markers,
        journal.clone(),
        live.clone(),
        Some(printer.clone()),
    )?];
    let out = streams::capture(
        running.stdout,
        Stream::Stdout,
        journal.clone(),
        true,
        Some(printer.clone()),
    )?;
    let err = streams::capture(
        running.stderr,
        Stream::Stderr,
        journal.clone(),
        true,
        Some(printer.clone()),
    )?;
    let mut child = running.child;
    let others = Arc::new(Mutex::new(contention::TickOthers::new(facts::cores())));
    let sampler = Sampler::spawn(
        config,
        Target { pid, pgid: pid },
        ready.gpu.clone(),
        ready.gpu_reason.clone(),
        Box::new(JournalSink {
            journal: journal.clone(),
            failed: false,
            printer: Some(printer.clone()),
            others: others.clone(),
        }),
    );
    let sampler = match sampler {
        Ok(x) => x,
        Err(e) => {
            // No watchdog, no engine: H1 forbids running unwatched.
            crate::sampler::kill_group(pid, libc::SIGKILL);
            let _ = child.wait();
            return Err(anyhow::Error::from(e).context("starting the sampler thread"));
        }
    };

    let intervention = supervise(pid, &sampler, &journal, plan.timeout_s, &signals);
    // Kill stragglers while the zombie leader still reserves the group id.
    crate::sampler::kill_group(pid, libc::SIGKILL);
    let report = sampler.stop();
    let status = spawn::reap(&mut child).context("reaping the engine")?;
    let cpu_end = contention::CpuMark::now();
    let t_end = monotonic_ns();
    if let Some(why) = journal.failure() {
        anyhow::bail!(
            "the run's journal {} could not be written ({why}); the engine was stopped. \
             Every record written before the failure is kept in {}: free space there, \
             then `harness recover --store {}` seals it as an incomplete bundle",
            journal.path().display(),
            staging.dir().display(),
            store.root().display()
        );
    }
    let intervention = intervention.or_else(|| report.trip.clone().map(Intervention::Watchdog));
    for h in [out, err] {
        join_bounded(h, DRAIN_TIMEOUT);
    }
    for h in readers {
        join_bounded(h, DRAIN_TIMEOUT);
    }
    let _ = printer.lock().unwrap_or_else(|e| e.into_inner()).finish();
    let live = live.lock().map(|l| l.clone()).unwrap_or_default();

    // Pixels.
    let expect = match &plan.rung {
        Some((_, r)) => Expect {
            frames: Some(r.frames),
            size: Some((r.width, r.height)),
        },
        None => Expect {
            frames: live.frames_written.map(|n| n as u32),
            size: None,
        },
    };
    let completion = completion::check_frames_dir(&frames_dir, expect);
    for f in &completion.frames {
        journal
            .append(&Record::Frame(f.clone()))
            .context("journaling a frame row")?;
    }
    use std::os::unix::process::ExitStatusExt;
    let facts = Facts {
        code: status.code(),
        signal: status.signal(),
        intervention,
        frames_pass: completion.verdict == completion::Verdict::Pass,
        completion_reason: completion.reasons.first().cloned(),
        open_phases: live.open.clone(),
    };
    let exit = classify::classify(&facts);
    let mut engine = ready.engine_fragment.clone();
    if let Some((name, version)) = &live.engine {
        engine["version"] = serde_json::json!(version);
        engine["name"] = serde_json::json!(name);
    }
    s.fragment("engine", engine)?;
    s.fragment("watchdog", ready.limits.fragment(report.trip.as_ref()))?;
    s.fragment("sensors_unavailable", report.reasons.fragment())?;
    let mut sf = SamplerConfig {
        cadence_ms: plan.cadence_ms,
        observer: plan.observer,
        limits: None,
        weights: vec![],
    }
    .fragment();
    sampler_results(&mut sf, &report);
    s.fragment("sampler", sf)?;
    let during = contention::during(&cpu_start, &cpu_end, facts::cores());
    // ...and inside each top-level phase the engine marked.
    let top_level = live.top_level.clone();
    let per_row = others
        .lock()
        .map(|mut o| std::mem::take(&mut o.values))
        .unwrap_or_default();
    let during = contention::with_phases(
        during.clone(),
        contention::by_phase(&per_row, &top_level, cpu_end.t_ns, during.limit_cores),
    );
    if during.flagged {
        eprintln!("harness: contention FLAGGED: {}", during.detail);
    }
    s.fragment(
        "contention",
        contention::with_during(&ready.contention, &during),
    )?;
    eprintln!(
        "harness: engine ended after {:.2} s; {} marker lines ({} malformed); {} samples, {} missed ticks",
        (t_end.saturating_sub(start_ns)) as f64 / 1e9,
        live.lines,
        live.malformed,
        report.ticks,
        report.missed_ticks
    );
    let code = if exit.reason == classify::Reason::Completed {
        exit::OK
    } else {
        exit::NEGATIVE
    };
    finish(&s, exit, completion, code)
}

/// Run every preflight gate in order.
fn preflight(
    s: &mut Session,
    plan: &RunPlan,
    store: &Store,
    staging: &Staging,
    rung_copy: Option<&Path>,
    signals: &signals::Signals,
) -> anyhow::Result<Result<Ready, Stopped>> {
    macro_rules! gate {
        ($g:expr) => {
            if let Err(r) = s.gate($g)? {
                return Ok(Err(Stopped::Refused(r)));
            }
            if let Some(sig) = signals.take() {
                return Ok(Err(Stopped::Interrupted(sig)));
            }
        };
    }
    macro_rules! refuse {
        ($name:expr, $why:expr) => {{
            let r = Refusal {
                gate: String::from($name),
                why: $why,
            };
            let _ = s.gate(Gate::new($name, Verdict::Refuse, r.why.clone()))?;
            return Ok(Err(Stopped::Refused(r)));
        }};
    }
    let rung = plan.rung.as_ref().map(|(_, r)| r);
    let lease_required = rung.is_some_and(|r| r.require.lease);
    gate!(gates::lease(lease_required, plan.lease_id.as_deref()));
    s.fragment(
        "lease",
        match plan
            .lease_id
            .as_deref()
            .map(str::trim)
            .filter(|x| !x.is_empty())
        {
            Some(id) => serde_json::json!({ "id": id }),
            None => serde_json::Value::Null,
        },
    )?;

    // The GPU (NVML once per run).
    let (gpu, gpu_reason) = match Gpu::open(0) {
        Ok(g) => (Some(Arc::new(g)), None),
        Err(why) => (None, Some(why)),
    };
    s.fragment(
        "gpu",
        gpu.as_ref()
            .map(|g| g.facts())
            .unwrap_or(serde_json::Value::Null),
    )?;
    // A CUDA rung on a machine with no usable GPU is refused here, before minutes
    // of weight synthesis and an engine that would fail at its first device call.
    if let Some((file, r)) = &plan.rung {
        match (r.device, &gpu, &gpu_reason) {
            (evidence::rung::Device::Cuda, None, Some(why)) => {
                refuse!("device", gates::no_gpu_for_cuda(file, why));
            }
            (evidence::rung::Device::Cuda, Some(g), _) => {
                gate!(Gate::new(
                    "device",
                    Verdict::Pass,
                    format!("cuda rung; NVML opened GPU {}", g.index())
                ));
            }
            _ => {}
        }
    }

    // H5: the engine runs from the store under its hash.
    let (source, exec) = match &plan.engine {
        Engine::Render { binary } => (Some(binary.clone()), false),
        Engine::Exec { program, .. } => (gates::resolve_program(program), true),
    };
    let copied = match source {
        None => Err(format!(
            "{}: not found (as a path or in PATH)",
            match &plan.engine {
                Engine::Exec { program, .. } => program.display().to_string(),
                Engine::Render { binary } => binary.display().to_string(),
            }
        )),
        Some(src) if !src.is_file() => Err(format!(
            "{}: no such engine binary (build it, or pass --engine PATH)",
            src.display()
        )),
        Some(src) => gates::copy_engine(&src, &store.bin_dir()),
    };
    let copied = match copied {
        Ok(c) => {
            gate!(Gate::new(
                "engine-binary",
                Verdict::Pass,
                format!(
                    "{} copied to {} (sha256 {})",
                    c.source.display(),
                    c.store_path.display(),
                    c.sha256
                )
            ));
            c
        }
        Err(why) => refuse!("engine-binary", why),
    };

    // Weights: given, or synthesized once into the cache.
    let weights = match (&plan.weights, &plan.engine, rung) {
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
    let weights = match weights {
        Some(Ok(w)) => {
            gate!(Gate::new(
                "weights",
                Verdict::Pass,
                format!(
                    "{} ({}, {} files)",
                    w.digest,
                    w.dir.display(),
                    w.files.len()
                )
            ));
            s.fragment("weights", w.fragment())?;
            Some(w)
        }
        Some(Err(e)) => refuse!("weights", e.to_string()),
        None => {
            s.fragment("weights", serde_json::Value::Null)?;
            None
        }
    };

    // The weights' page-cache state at engine start (as-is only records it).
    match (&weights, plan.weights_cache) {
        (Some(w), policy) => match crate::weights_cache::prepare(&w.paths(), policy) {
            Ok(p) => {
                // The figures as numbers too: rank pairs weight-reading metrics
                // only between runs that started in about the same cache state.
                s.fragment("weights_cache", serde_json::to_value(&p)?)?;
                gate!(p.gate());
            }
            Err(e) if policy == crate::weights_cache::Policy::AsIs => {
                gate!(Gate::new(
                    "weights-cache",
                    Verdict::NotApplicable,
                    format!("as-is: {e}")
                ));
            }
            Err(e) => refuse!("weights-cache", e.to_string()),
        },
        (None, crate::weights_cache::Policy::AsIs) => {}
        (None, policy) => refuse!(
            "weights-cache",
            format!(
                "--weights-cache {}: this run names no weight files (give --weights, or run a rung)",
                policy.as_str()
            )
        ),
    }

    // The command line.
    let command = match &plan.engine {
        Engine::Render { .. } => {
            let (Some(rung_copy), Some(r), Some(w)) = (rung_copy, rung, &weights) else {
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
            a.extend(lever_args(plan));
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
    };
    let engine_fragment = serde_json::json!({
        "store_path": copied.store_path,
        "source_path": copied.source,
        "sha256": copied.sha256,
        "version": null,
        "args": command,
        "exec": exec,
    });
    s.fragment("engine", engine_fragment.clone())?;

    // The watchdog's limits.
    let mem_total = crate::sampler::system::mem_total_bytes().map_err(anyhow::Error::msg)?;
    let floor = plan.mem_floor.unwrap_or_else(|| default_floor(mem_total));
    let unified_gpu = gpu.as_ref().is_some_and(|g| g.unified_memory());
    let budget = plan
        .unified_budget
        .or_else(|| unified_gpu.then(|| mem_total.saturating_sub(floor)));
    let limits = Limits {
        mem_floor_bytes: floor,
        unified_budget_bytes: budget,
    };
    s.fragment("watchdog", limits.fragment(None))?;

    // Contention: recorded and flagged, never refused.
    let load1 = crate::sampler::system::load1().ok();
    let busy = gates::busy_cores(Duration::from_millis(gates::CONTENTION_WINDOW_MS));
    let c = gates::contention(
        busy,
        load1,
        facts::cores(),
        gpu.as_deref(),
        std::process::id(),
    );
    let flagged = c["flagged"].as_bool().unwrap_or(false);
    let detail = c["detail"].as_str().unwrap_or("").to_string();
    s.fragment("contention", c.clone())?;
    gate!(Gate::new(
        "contention",
        Verdict::Pass,
        if flagged {
            format!("FLAGGED: {detail}")
        } else {
            detail
        }
    ));

    // Headroom.
    let avail = crate::sampler::system::mem_available_bytes().map_err(anyhow::Error::msg)?;
    match &plan.engine {
        Engine::Render { .. } => {
            let mut pa = vec![
                "--rung".to_string(),
                rung_copy
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ];
            pa.extend(lever_args(plan));
            match gates::engine_plan(&copied.store_path, &pa) {
                Ok(p) => {
                    gate!(gates::headroom(&p, avail, floor, unified_gpu));
                }
                Err(why) => refuse!("headroom", format!("no projection to check: {why}")),
            }
        }
        Engine::Exec { .. } => {
            if avail < floor {
                refuse!(
                    "headroom",
                    format!("MemAvailable {avail} B is already below the floor {floor} B")
                );
            }
            gate!(Gate::new(
                "headroom",
                Verdict::NotApplicable,
                format!("--exec engines have no plan; MemAvailable {avail} B, floor {floor} B")
            ));
        }
    }

    // H1: the watchdog must be seen to fire before the engine is trusted to it.
    let me = std::env::current_exe().context("locating the harness binary")?;
    let mut kinds = vec![ControlKind::Floor];
    if budget.is_some() {
        kinds.push(ControlKind::UnifiedBudget);
    }
    for kind in kinds {
        let c = watchdog_control::control(&me, kind, plan.cadence_ms, floor);
        let (passed, name, detail) = (c.passed(), c.name.clone(), c.detail.clone());
        s.control(c)?;
        gate!(Gate::new(
            "watchdog-control",
            if passed {
                Verdict::Pass
            } else {
                Verdict::Refuse
            },
            format!("{name}: {detail}")
        ));
    }
    s.control(crate::control::gpu_control_for_run(
        store,
        gpu.as_deref(),
        gpu_reason.as_deref(),
    ))?;

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
        contention: c,
    }))
}

/// `--lever K=V`... and `--profile P` for the engine.
fn lever_args(plan: &RunPlan) -> Vec<String> {
    let mut a = Vec::new();
    for (k, v) in &plan.levers {
        a.push("--lever".into());
        a.push(format!("{k}={v}"));
    }
    a.push("--profile".into());
    a.push(plan.profile.clone());
    a
}

/// Record the `rung` fragment and copy the rung file into the staging scratch dir
/// (the engine reads the copy, so an edit mid-run cannot change what ran).
fn record_rung(
    s: &Session,
    path: &Path,
    rung: &evidence::rung::Rung,
    staging: &Staging,
) -> anyhow::Result<PathBuf> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    use sha2::Digest;
    let sha = format!("{:x}", sha2::Sha256::digest(&bytes));
    let scratch = staging.scratch_dir();
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let copy = scratch.join("rung.toml");
    std::fs::write(&copy, &bytes).with_context(|| format!("writing {}", copy.display()))?;
    let name = path
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    s.fragment(
        "rung",
        serde_json::json!({
            "name": name,
            "path": path,
            "sha256": sha,
            "config": rung,
        }),
    )?;
    Ok(copy)
}

/// Watch the engine until it ends; returns what the harness did to end it.
fn supervise(
    pid: i32,
    sampler: &Sampler,
    journal: &SharedJournal,
    timeout_s: Option<f64>,
    signals: &signals::Signals,
) -> Option<Intervention> {
    let started = Instant::now();
    let mut intervention = None;
    loop {
        // The watchdog kills from the sampler thread, so the engine may already be
        // gone when its trip is first seen here: look at the trip before the exit.
        let exited = spawn::has_exited(pid);
        if intervention.is_none() {
            if let Some(t) = sampler.tripped() {
                eprintln!(
                    "harness: WATCHDOG: {} = {} B crossed {} B; engine group killed",
                    t.column, t.value, t.limit
                );
                intervention = Some(Intervention::Watchdog(t));
                continue;
            }
        }
        if exited {
            return intervention;
        }
        if intervention.is_none() {
            // A journal that cannot be written (full disk) ends the run: evidence
            // that is not kept must not be produced.
            if let Some(why) = journal.failure() {
                eprintln!("harness: JOURNAL WRITE FAILED ({why}): stopping the engine");
                spawn::terminate(pid, KILL_GRACE);
                return intervention;
            }
            if let Some(sig) = signals.take() {
                eprintln!("harness: {sig}: stopping the engine (SIGTERM, SIGKILL after {KILL_GRACE:?}); the run will be sealed as interrupted");
                intervention = Some(Intervention::Interrupted(sig));
                spawn::terminate(pid, KILL_GRACE);
                continue;
            }
            if let Some(t) = timeout_s {
                if started.elapsed().as_secs_f64() >= t {
                    eprintln!("harness: timeout of {t} s: stopping the engine");
                    intervention = Some(Intervention::Timeout(t));
                    spawn::terminate(pid, KILL_GRACE);
                    continue;
                }
            }
        } else if signals.take().is_some() {
            // A second Ctrl-C while stopping: no more grace.
            crate::sampler::kill_group(pid, libc::SIGKILL);
        }
        std::thread::sleep(POLL);
    }
}

/// Join `h`, giving up after `timeout` (a process outside the engine's group may
/// still hold the pipe; the run must not hang on it).
fn join_bounded<T>(h: JoinHandle<T>, timeout: Duration) {
    let until = Instant::now() + timeout;
    while !h.is_finished() {
        if Instant::now() >= until {
            eprintln!(
                "harness: a reader thread is still blocked after {timeout:?} (a process outside the engine's group holds its pipe); continuing"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = h.join();
}

/// Add the sampler's own results to its fragment.
fn sampler_results(f: &mut serde_json::Value, r: &SamplerReport) {
    f["ticks"] = serde_json::json!(r.ticks);
    f["missed_ticks"] = serde_json::json!(r.missed_ticks);
    f["tick_cost_us"] = serde_json::to_value(&r.cost).unwrap_or_default();
    f["tick_cost_parts_us"] = serde_json::to_value(&r.parts).unwrap_or_default();
}

/// Write the closing fragments, seal, print the phase table and the bundle.
#[allow(clippy::too_many_arguments)]
fn conclude(
    s: &Session,
    store: &Store,
    staging: &Staging,
    start: facts::RunStart,
    argv: &[String],
    cwd: &Path,
    exit: classify::Exit,
    completion: Completion,
    code: u8,
) -> anyhow::Result<u8> {
    s.fragment("completion", completion.fragment())?;
    s.fragment("exit", serde_json::to_value(&exit)?)?;
    s.fragment(
        "run",
        facts::run_fragment(start, Some(monotonic_ns()), argv, cwd),
    )?;
    s.journal.clone().finish().context("closing the journal")?;
    let sealed = evidence::seal::seal(staging.dir(), store).context("sealing the bundle")?;
    let table = crate::bundle::tables::phase_table_text(&sealed.path)
        .unwrap_or_else(|e| format!("(phase table unavailable: {e})\n"));
    let mut out = std::io::stdout().lock();
    // A closed stdout must not turn a sealed run into a failure.
    let _ = write!(out, "{table}");
    let _ = writeln!(
        out,
        "exit: {} ({})",
        serde_json::to_value(exit.reason)?.as_str().unwrap_or("?"),
        exit.detail
    );
    let _ = writeln!(
        out,
        "completion: {}{}",
        serde_json::to_value(&completion.verdict)?
            .as_str()
            .unwrap_or("?"),
        completion
            .reasons
            .first()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "bundle: {}", sealed.id);
    let _ = writeln!(out, "path: {}", sealed.path.display());
    Ok(code)
}
