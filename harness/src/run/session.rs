//! What a run writes through its journal while it runs: the session (fragments,
//! gates and controls, each printed as it is recorded) and the sink the sampler
//! hands its rows to.

use evidence::fragments::{self as frag, Fragment};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use evidence::clock::monotonic_ns;
use evidence::journal::{Record, SharedJournal};

use crate::control::watchdog::ControlResult;
use crate::exit::Refusal;
use crate::gate_verdict::{Gate, Verdict};
use crate::run::contention;
use crate::sampler::{Reasons, SampleSink};

/// The journal-backed sink for sampler rows.
pub(super) struct JournalSink {
    /// The run's journal.
    pub(super) journal: SharedJournal,
    /// Whether an append has failed (reported once).
    pub(super) failed: bool,
    /// The live status line, fed every sample (GPU utilization, RSS).
    pub(super) printer: Option<crate::progress::SharedPrinter>,
    /// Other work per row, judged per phase once the engine is reaped. Locked
    /// by the sampler's thread only until the sampler stops.
    pub(super) others: Arc<Mutex<contention::TickOthers>>,
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
        match frag::journal_record(&reasons.fragment()) {
            Ok(r) => self.append(&r),
            Err(e) => eprintln!("harness: cannot encode the unavailable sensors: {e}"),
        }
    }
}

/// The run's journal and the gate and control lists written through it.
pub(super) struct Session {
    /// The run's journal.
    pub(super) journal: SharedJournal,
    /// Every gate recorded so far, in order (the `gates` fragment).
    pub(super) gates: Vec<Gate>,
    /// Every control recorded so far, in order (the `controls` fragment).
    pub(super) controls: Vec<ControlResult>,
}

impl Session {
    /// Journal `record`, fragment `F`'s.
    fn append<F: Fragment>(&self, record: Record) -> anyhow::Result<()> {
        self.journal
            .append(&record)
            .with_context(|| format!("writing the '{}' fragment to the journal", F::KEY))
    }

    /// Journal fragment `f` under its key.
    pub(super) fn record<F: Fragment>(&self, f: &F) -> anyhow::Result<()> {
        self.append::<F>(frag::journal_record(f)?)
    }

    /// Journal fragment `F` as null: the run has none.
    pub(super) fn record_null<F: Fragment>(&self) -> anyhow::Result<()> {
        self.append::<F>(frag::null_record::<F>())
    }

    /// Journal fragment `F` as it was given (see [`frag::verbatim_record`]).
    pub(super) fn record_verbatim<F: Fragment>(
        &self,
        value: serde_json::Value,
    ) -> anyhow::Result<()> {
        self.append::<F>(frag::verbatim_record::<F>(value))
    }

    /// Record `g`; a refusal becomes the error that ends preflight.
    pub(super) fn gate(&mut self, g: Gate) -> anyhow::Result<Result<(), Refusal>> {
        let refusal = (g.verdict == Verdict::Refuse).then(|| Refusal {
            gate: g.name.clone(),
            why: g.detail.clone(),
        });
        eprintln!(
            "harness: gate {:<16} {:<14} {}",
            g.name,
            g.verdict.as_str(),
            g.detail
        );
        self.gates.push(g);
        self.record(&frag::Gates(
            self.gates.iter().map(Gate::verdicted).collect(),
        ))?;
        Ok(refusal.map_or(Ok(()), Err))
    }

    /// Record control `c` (printed, and the whole `controls` fragment rewritten).
    pub(super) fn control(&mut self, c: ControlResult) -> anyhow::Result<()> {
        eprintln!(
            "harness: control {:<24} {:<14} {}",
            c.name, c.verdict, c.detail
        );
        self.controls.push(c);
        self.record(&frag::Controls(
            self.controls.iter().map(ControlResult::verdicted).collect(),
        ))
    }
}
