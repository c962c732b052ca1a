//! `harness run`: preflight gates, the engine under a sampler and a watchdog, exit
//! classification, the pixel completion check, and the seal.
//!
//! Every run that gets as far as a durable store leaves a bundle: a refused run
//! records the refusal, an interrupted or killed run records every phase it
//! reached and names the open one. Only a refusal of the store itself (H2) leaves
//! nothing, since there is nowhere durable to write.
//!
//! [`run`] reads as its steps: open the store and the journal, `preflight`'s
//! gates, start the engine under the sampler, `supervise` it, stop and drain it,
//! check its pixels, record what was measured, and seal.

pub mod config;
pub mod contention;
pub mod escaped;
pub mod facts;
pub mod gate_checks;
pub mod input;
pub mod markers;
pub mod pinned;
mod preflight;
mod session;
pub mod signals;
pub mod spawn;
pub mod streams;
mod supervise;

use evidence::fragments as frag;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use evidence::clock::monotonic_ns;
use evidence::error::StoreError;
use evidence::journal::{Record, SharedJournal, Stream};
use evidence::store::{Staging, Store};

use crate::classify::{self, Facts, Intervention};
use crate::completion::{self, Completion, Expect};
use crate::exit::{self, Refusal};
use crate::gate_verdict::{Gate, Verdict};
use crate::sampler::{Sampler, SamplerConfig, SamplerResults, Target};
use crate::weights::Weights;
use config::{Engine, RunConfig};
use markers::Live;
use preflight::{preflight, Ready, Stopped};
use session::{JournalSink, Session};
use supervise::{join_bounded, supervise};

/// How long the engine gets between SIGTERM and SIGKILL when the harness stops it.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// How long the output readers get to drain after the engine's group is gone.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// `harness run`: returns the exit code.
pub fn run(config: &RunConfig) -> anyhow::Result<u8> {
    // What the engine refuses as input is a usage error, found before the store
    // is opened (nothing is left behind).
    if let (Engine::Render { binary }, Some((rung, _))) = (&config.engine, &config.rung) {
        input::check(binary, rung, &preflight::lever_args(config))?;
    }
    // A bucket is reached before anything is written: a run that could not be
    // published is refused up front (exit 3), not found out after the render.
    let remote = remote_target(config)?;
    let argv: Vec<String> = std::env::args().collect();
    let cwd = std::env::current_dir().unwrap_or_default();
    let start = facts::RunStart::now();
    let signals = signals::Signals::install().context("installing signal handlers")?;
    let Opened {
        store,
        staging,
        mut session,
        rung_copy,
        sampler_config,
    } = open(config, start, &argv, &cwd)?;
    let s = &mut session;
    let ready = preflight(s, config, &store, &staging, rung_copy.as_deref(), &signals)?;
    let finish = |s: &Session, exit: classify::Exit, completion: Completion, code: u8| {
        let (code, sealed) = conclude(
            s, &store, &staging, start, &argv, &cwd, exit, completion, code,
        )?;
        publish_sealed(remote.as_ref(), &store, &sealed, code)
    };
    let ready = match ready {
        Ok(r) => r,
        Err(stop) => {
            if let Stopped::Refused(r) = &stop {
                eprintln!("harness: {r}");
            }
            let (e, code) = stop.exit(signals.take());
            return finish(
                s,
                e,
                Completion::not_checked("the engine never started"),
                code,
            );
        }
    };

    let frames_dir = staging.frames_dir();
    std::fs::create_dir_all(&frames_dir)
        .with_context(|| format!("creating {}", frames_dir.display()))?;
    let watched = match start_engine(&ready, sampler_config, &frames_dir, &s.journal)? {
        Ok(w) => w,
        Err(exit) => {
            let c = Completion::not_checked("the engine never started");
            return finish(s, exit, c, exit::NEGATIVE);
        }
    };
    let intervention = supervise(
        watched.pid,
        &watched.sampler,
        &s.journal,
        config.timeout_s,
        &signals,
    );
    let ended = stop_engine(watched, intervention, &s.journal, &staging, &store)?;
    check_pinned(&ready, &s.journal);
    let completion = check_completion(config, &ended.live, &frames_dir, &s.journal)?;
    let facts = Facts {
        code: ended.status.code(),
        signal: ended.status.signal(),
        intervention: ended.intervention.clone(),
        frames_pass: completion.verdict == completion::Verdict::Pass,
        completion_reason: completion.reasons.first().cloned(),
        open_phases: ended.live.open.clone(),
    };
    let exit = classify::classify(&facts);
    record_measurements(s, config, &ready, &ended)?;
    eprintln!(
        "harness: engine ended after {:.2} s; {} marker lines ({} malformed); {} samples, {} missed ticks",
        (ended.t_end.saturating_sub(start.mono_ns)) as f64 / 1e9,
        ended.live.lines,
        ended.live.malformed,
        ended.report.ticks,
        ended.report.missed_ticks
    );
    let code = if exit.reason == classify::Reason::Completed {
        exit::OK
    } else {
        exit::NEGATIVE
    };
    finish(s, exit, completion, code)
}

/// The store, staging directory and journal a run writes into, and what was
/// settled before the gates.
struct Opened {
    /// The store (past its durability gate).
    store: Store,
    /// The run's staging directory (locked while the run lives).
    staging: Staging,
    /// The journal and the gates and controls written through it.
    session: Session,
    /// The rung file's copy in the staging directory, for a rung run.
    rung_copy: Option<PathBuf>,
    /// The sampler's settings (limits and weights are added once preflight set them).
    sampler_config: SamplerConfig,
}

/// H2: open the durable store (a volatile one is refused: nowhere to leave a
/// bundle), a staging directory and its journal; record the run's first
/// fragments, the rung and the `store-durable` gate.
fn open(
    config: &RunConfig,
    start: facts::RunStart,
    argv: &[String],
    cwd: &Path,
) -> anyhow::Result<Opened> {
    // With a bucket, the run stages and seals in this machine's local store.
    let local = match crate::remote::location_of(config.store.as_deref())? {
        Some(_) => {
            Some(evidence::store::local_default_location().map_err(crate::remote::store_error)?)
        }
        None => config.store.clone(),
    };
    let store = Store::resolve(local.as_deref()).map_err(|e| match e {
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
        journal,
        gates: Vec::new(),
        controls: Vec::new(),
    };
    s.record(&facts::run_fragment(start, None, argv, cwd))?;
    s.record(&facts::host_fragment())?;
    s.record(&frag::StoreFragment {
        volatile_override: false,
    })?;
    s.record(&frag::Profile(config.profile.clone()))?;
    s.record(&frag::Levers(config.levers.clone()))?;
    if let Some(schedule) = &config.schedule {
        s.record_verbatim::<frag::Schedule>(schedule.clone())?;
    }
    let sampler_config = SamplerConfig {
        cadence_ms: config.cadence_ms,
        observer: config.observer,
        limits: None,
        weights: Vec::new(),
    };
    s.record(&sampler_config.fragment())?;
    let rung_copy = match &config.rung {
        Some((path, rung)) => Some(record_rung(&s, path, rung, &staging)?),
        None => None,
    };
    s.gate(Gate::new(
        "store-durable",
        Verdict::Pass,
        format!("{} is on durable storage", store.root().display()),
    ))?
    .map_err(anyhow::Error::from)?;
    Ok(Opened {
        store,
        staging,
        session: s,
        rung_copy,
        sampler_config,
    })
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
    s.record(&frag::Rung {
        name: Some(name),
        path: Some(path.to_path_buf()),
        sha256: Some(sha),
        config: Some(serde_json::to_value(rung)?),
    })?;
    Ok(copy)
}

/// The engine running under the instrument.
struct Watched {
    /// The engine process.
    child: Child,
    /// Its pid, also its process group id.
    pid: i32,
    /// The marker reader's thread.
    readers: Vec<JoinHandle<()>>,
    /// The stdout and stderr readers' threads.
    outputs: [JoinHandle<u64>; 2],
    /// The live status line.
    printer: crate::progress::SharedPrinter,
    /// The live marker state (open phases, steps, frames written).
    live: Arc<Mutex<Live>>,
    /// Other work on the host per sampler row.
    others: Arc<Mutex<contention::TickOthers>>,
    /// The sampler, watchdog armed.
    sampler: Sampler,
    /// The CPU counters when the engine started.
    cpu_start: contention::CpuMark,
}

/// Start the engine, the readers of its markers and output, the live status and
/// the sampler (with the watchdog armed with `ready`'s limits). `Ok(Err(exit))`
/// when the engine could not be started (the run is sealed with that exit); an
/// error when the sampler could not, after killing the engine (H1 forbids
/// running unwatched).
fn start_engine(
    ready: &Ready,
    mut config: SamplerConfig,
    frames_dir: &Path,
    journal: &SharedJournal,
) -> anyhow::Result<Result<Watched, classify::Exit>> {
    config.limits = Some(ready.limits.clone());
    config.weights = ready
        .weights
        .as_ref()
        .map(Weights::paths)
        .unwrap_or_default();
    let cpu_start = contention::CpuMark::now();
    // Descendants that leave the engine's group come back to the harness when
    // the engine ends (see escaped.rs).
    if !escaped::become_subreaper() {
        eprintln!(
            "harness: cannot become a child subreaper: a descendant that leaves the engine's process group would outlive the run unseen"
        );
    }
    let running = match spawn::spawn(&ready.command, frames_dir) {
        Ok(r) => r,
        Err(e) => {
            return Ok(Err(classify::Exit {
                reason: classify::Reason::EngineFailed,
                code: None,
                signal: None,
                detail: format!("could not start {}: {e}", ready.command.program.display()),
                open_phases: vec![],
            }));
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
    Ok(Ok(Watched {
        child,
        pid,
        readers,
        outputs: [out, err],
        printer,
        live,
        others,
        sampler,
        cpu_start,
    }))
}

/// What the engine's end left behind.
struct Ended {
    /// The engine's exit status.
    status: ExitStatus,
    /// The sampler's report (ticks, cost, the watchdog's trip).
    report: SamplerResults,
    /// What the harness did to end the engine (the watchdog's trip included).
    intervention: Option<Intervention>,
    /// The marker state at the end.
    live: Live,
    /// Other work on the host per sampler row.
    others: Arc<Mutex<contention::TickOthers>>,
    /// The CPU counters when the engine started and when it was reaped.
    cpu: (contention::CpuMark, contention::CpuMark),
    /// When the engine was reaped, CLOCK_MONOTONIC ns.
    t_end: u64,
}

/// Stop what is left of the engine's group, the sampler and the readers, and
/// reap the engine. A journal that could not be written ends the command here,
/// saying how to recover what it kept.
fn stop_engine(
    w: Watched,
    intervention: Option<Intervention>,
    journal: &SharedJournal,
    staging: &Staging,
    store: &Store,
) -> anyhow::Result<Ended> {
    let Watched {
        mut child,
        pid,
        readers,
        outputs,
        printer,
        live,
        others,
        sampler,
        cpu_start,
    } = w;
    // Kill stragglers while the zombie leader still reserves the group id.
    crate::sampler::kill_group(pid, libc::SIGKILL);
    // Then what left the group (setsid): handed to this process, the subreaper.
    let escaped = escaped::kill_escaped(pid, 8);
    if !escaped.is_empty() {
        let names: Vec<String> = escaped
            .iter()
            .map(|e| format!("{} ({})", e.pid, e.comm))
            .collect();
        eprintln!(
            "harness: {} process(es) had left the engine's process group and outlived it: {}; killed",
            escaped.len(),
            names.join(", ")
        );
        let fragment = frag::Escaped {
            killed: Some(escaped),
            detail: Some("descendants of the engine outside its process group (setsid or setpgid), alive after it ended; killed and reaped by the harness (a child subreaper)".into()),
            rest: serde_json::Map::new(),
        };
        if let Err(e) = frag::journal_record(&fragment)
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(journal.append(&r)?))
        {
            eprintln!("harness: could not journal the escaped processes: {e}");
        }
    }
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
    for h in outputs {
        join_bounded(h, DRAIN_TIMEOUT);
    }
    for h in readers {
        join_bounded(h, DRAIN_TIMEOUT);
    }
    let _ = printer.lock().unwrap_or_else(|e| e.into_inner()).finish();
    let live = live.lock().map(|l| l.clone()).unwrap_or_default();
    Ok(Ended {
        status,
        report,
        intervention,
        live,
        others,
        cpu: (cpu_start, cpu_end),
        t_end,
    })
}

/// An `--exec` engine's pinned inputs hashed again now that it ended; changes
/// go into the `exec_check` fragment (rank does not compare such a run).
fn check_pinned(ready: &Ready, journal: &SharedJournal) {
    let Some(p) = &ready.pinned else { return };
    let changed = p.changes(p.python_program().as_deref());
    if changed.is_empty() {
        return;
    }
    for c in &changed {
        eprintln!("harness: changed while the engine ran: {c}");
    }
    let fragment = frag::ExecCheck {
        changed: Some(changed.into_iter().map(serde_json::Value::String).collect()),
        detail: Some("inputs pinned before the engine started (program, interpreter, file arguments, python distributions) differ after it ended".into()),
        rest: serde_json::Map::new(),
    };
    if let Err(e) = frag::journal_record(&fragment)
        .map_err(anyhow::Error::from)
        .and_then(|r| Ok(journal.append(&r)?))
    {
        eprintln!("harness: could not journal the changed inputs: {e}");
    }
}

/// The pixel completion check on the frames the engine left (the rung's frame
/// count and size, else the count its markers announced); a `frame` record per
/// frame read.
fn check_completion(
    config: &RunConfig,
    live: &Live,
    frames_dir: &Path,
    journal: &SharedJournal,
) -> anyhow::Result<Completion> {
    let expect = match &config.rung {
        Some((_, r)) => Expect {
            frames: Some(r.frames),
            size: Some((r.width, r.height)),
        },
        None => Expect {
            frames: live.frames_written.map(|n| n as u32),
            size: None,
        },
    };
    let completion = completion::check_frames_dir(frames_dir, expect);
    for f in &completion.frames {
        journal
            .append(&Record::Frame(f.clone()))
            .context("journaling a frame row")?;
    }
    Ok(completion)
}

/// Record what the run measured once the engine ended: the engine's name and
/// version, the watchdog's trip, unavailable sensors, the sampler's own results,
/// and contention during the run and in each top-level phase.
fn record_measurements(
    s: &Session,
    config: &RunConfig,
    ready: &Ready,
    ended: &Ended,
) -> anyhow::Result<()> {
    let mut engine = ready.engine_fragment.clone();
    if let Some((name, version)) = &ended.live.engine {
        engine.version = Some(version.clone());
        engine.name = Some(name.clone());
    }
    s.record(&engine)?;
    s.record(&ready.limits.fragment(ended.report.trip.as_ref()))?;
    s.record(&ended.report.reasons.fragment())?;
    let mut sf = SamplerConfig {
        cadence_ms: config.cadence_ms,
        observer: config.observer,
        limits: None,
        weights: vec![],
    }
    .fragment();
    ended.report.record_into(&mut sf);
    s.record(&sf)?;
    let (cpu_start, cpu_end) = &ended.cpu;
    let during = contention::during(cpu_start, cpu_end, facts::cores());
    // ...and inside each top-level phase the engine marked.
    let top_level = ended.live.top_level.clone();
    let per_row = ended
        .others
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
    s.record(&contention::with_during(&ready.contention, &during))
}

/// Write the closing fragments, seal, print the phase table and the bundle;
/// the exit code and the sealed bundle's directory.
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
) -> anyhow::Result<(u8, PathBuf)> {
    s.record(&completion.fragment())?;
    s.record(&exit.fragment())?;
    s.record(&facts::run_fragment(start, Some(monotonic_ns()), argv, cwd))?;
    s.journal.clone().finish().context("closing the journal")?;
    let sealed = match evidence::seal::seal(staging.dir(), store) {
        Ok(sealed) => sealed,
        // The store failed its gate at seal time (a directory swapped for a
        // link during the run): nothing leaves staging.
        Err(evidence::error::SealError::Store(e @ StoreError::Volatile { .. })) => {
            return Err(Refusal {
                gate: "store-durable".into(),
                why: format!(
                    "at seal: {e}; the sealed bundle stays in staging {}: once the store is \
                     whole again, `harness recover --store {}` publishes it",
                    staging.dir().display(),
                    store.root().display()
                ),
            }
            .into())
        }
        Err(e) => return Err(anyhow::Error::from(e).context("sealing the bundle")),
    };
    let table = crate::bundle::tables::phase_table_text(&sealed.path)
        .unwrap_or_else(|e| format!("(phase table unavailable: {e})\n"));
    let mut out = std::io::stdout().lock();
    // A closed stdout must not turn a sealed run into a failure.
    let _ = write!(out, "{table}");
    let _ = writeln!(out, "exit: {} ({})", exit.reason.as_str(), exit.detail);
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
    Ok((code, sealed.path))
}

/// The bucket a run publishes to, reached once before the run starts (a LIST of
/// its bundles' prefix): unreachable, unauthorized or misconfigured is refused
/// by gate `store-remote` (exit 3) before anything is written.
fn remote_target(config: &RunConfig) -> anyhow::Result<Option<crate::remote::Bucket>> {
    let Some(loc) = crate::remote::location_of(config.store.as_deref())? else {
        return Ok(None);
    };
    let refuse = |why: String| -> anyhow::Error {
        Refusal {
            gate: "store-remote".into(),
            why,
        }
        .into()
    };
    let bucket = crate::remote::Bucket::open(&loc).map_err(|e| refuse(e.to_string()))?;
    bucket
        .list_bundle("0")
        .map_err(|e| refuse(format!("the bucket cannot be listed: {e}")))?;
    Ok(Some(bucket))
}

/// Publish the bundle just sealed to `remote` (noted in the local store's
/// outbox first). The run's own exit code stands when it lands; when it does
/// not, the bundle stays sealed and owed locally, the message says how to
/// finish it, and the run exits 4.
fn publish_sealed(
    remote: Option<&crate::remote::Bucket>,
    store: &Store,
    dir: &Path,
    code: u8,
) -> anyhow::Result<u8> {
    let Some(bucket) = remote else {
        return Ok(code);
    };
    let loc = bucket.location();
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match crate::remote::publish::publish(bucket, Some(store), dir) {
        Ok(p) => {
            println!(
                "published: {} ({} objects written, {} already there)",
                loc.bundle_url(&id),
                p.written,
                p.present
            );
            Ok(code)
        }
        Err(e) => {
            eprintln!(
                "harness: bundle {id} is sealed in {} but not in {loc}: {e}; `harness recover \
                 --store {loc}` finishes the upload",
                store.root().display()
            );
            Ok(exit::INTERNAL)
        }
    }
}
