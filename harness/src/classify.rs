//! Exit classification: why a run ended, as the `exit` manifest fragment.
//!
//! The harness's own interventions come first (it knows why it killed the engine):
//! `watchdog`, `timeout`, `interrupted`. Otherwise completion is judged on pixels:
//! frames that pass the pixel check make the run `completed` whatever the exit code
//! (a helper missing after every frame was written is not a failed render), and
//! frames that fail make it `killed` (the engine died by a signal) or
//! `engine-failed` (it exited, even with code 0).

use serde::Serialize;

use crate::sampler::limits::Trip;

/// Why a run ended: the manifest's `exit.reason` (`specs/bundle.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The frames passed the pixel check.
    Completed,
    /// The engine exited on its own and the frames did not pass.
    EngineFailed,
    /// The engine died by a signal the harness did not send.
    Killed,
    /// The memory watchdog killed the engine.
    Watchdog,
    /// `--timeout` expired and the harness stopped the engine.
    Timeout,
    /// The harness was interrupted (Ctrl-C, SIGTERM) and stopped the engine.
    Interrupted,
    /// A gate refused the run before the engine started.
    GateRefused,
}

impl Reason {
    /// The reason as the manifest writes it (`completed`, `engine-failed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Completed => "completed",
            Reason::EngineFailed => "engine-failed",
            Reason::Killed => "killed",
            Reason::Watchdog => "watchdog",
            Reason::Timeout => "timeout",
            Reason::Interrupted => "interrupted",
            Reason::GateRefused => "gate-refused",
        }
    }
}

/// What the harness did to end the run, if anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Intervention {
    /// The watchdog tripped.
    Watchdog(Trip),
    /// The timeout, in seconds, expired.
    Timeout(f64),
    /// The harness received this signal (name).
    Interrupted(&'static str),
}

/// Everything classification looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// The engine's exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended the engine, if one did.
    pub signal: Option<i32>,
    /// The harness's intervention.
    pub intervention: Option<Intervention>,
    /// Whether the frames passed the pixel check.
    pub frames_pass: bool,
    /// The first failed completion reason, when they did not.
    pub completion_reason: Option<String>,
    /// The phases still open when the engine ended, outermost first.
    pub open_phases: Vec<String>,
}

/// The `exit` fragment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exit {
    /// Why the run ended.
    pub reason: Reason,
    /// The engine's exit code.
    pub code: Option<i32>,
    /// The signal that ended the engine.
    pub signal: Option<i32>,
    /// A sentence for people.
    pub detail: String,
    /// The phases open at the end, outermost first (the open one is the last).
    pub open_phases: Vec<String>,
}

impl Exit {
    /// The `exit` fragment's record.
    pub fn fragment(&self) -> evidence::fragments::Exit {
        evidence::fragments::Exit {
            reason: Some(self.reason.as_str().to_string()),
            code: self.code,
            signal: self.signal,
            detail: Some(self.detail.clone()),
            open_phases: Some(self.open_phases.clone()),
            rest: serde_json::Map::new(),
        }
    }
}

/// The name of signal `sig` (`SIGKILL`), or its number.
pub fn signal_name(sig: i32) -> String {
    let known = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    known
        .iter()
        .find(|(n, _)| *n == sig)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("signal {sig}"))
}

/// Classify the end of a run that started its engine.
pub fn classify(f: &Facts) -> Exit {
    let ended = match (f.code, f.signal) {
        (_, Some(s)) => format!("ended by {}", signal_name(s)),
        (Some(c), None) => format!("exited with code {c}"),
        (None, None) => "ended without a status".to_string(),
    };
    let during = match f.open_phases.last() {
        Some(_) => format!(" during {}", f.open_phases.join(" > ")),
        None => String::new(),
    };
    let why_frames = f
        .completion_reason
        .as_deref()
        .map(|r| format!("; frames: {r}"))
        .unwrap_or_default();
    let (reason, detail) = match &f.intervention {
        Some(Intervention::Watchdog(t)) => (
            Reason::Watchdog,
            format!(
                "watchdog killed the engine{during}: {} = {} B crossed the limit {} B",
                t.column, t.value, t.limit
            ),
        ),
        Some(Intervention::Timeout(s)) => (
            Reason::Timeout,
            format!("timeout of {s} s expired{during}; engine {ended}"),
        ),
        Some(Intervention::Interrupted(sig)) => (
            Reason::Interrupted,
            format!("harness received {sig}{during}; engine {ended}; the bundle is partial"),
        ),
        None if f.frames_pass => (
            Reason::Completed,
            match f.code {
                Some(0) => "engine exited with code 0 and the frames pass".to_string(),
                _ => format!("the frames pass although the engine {ended}"),
            },
        ),
        None if f.signal.is_some() => (
            Reason::Killed,
            format!("engine {ended}{during}{why_frames}"),
        ),
        None => (
            Reason::EngineFailed,
            format!("engine {ended}{during}{why_frames}"),
        ),
    };
    Exit {
        reason,
        code: f.code,
        signal: f.signal,
        detail,
        open_phases: f.open_phases.clone(),
    }
}

/// The `exit` fragment of a run refused by a gate.
pub fn refused(gate: &str, why: &str) -> Exit {
    Exit {
        reason: Reason::GateRefused,
        code: None,
        signal: None,
        detail: format!("refused by gate '{gate}': {why}"),
        open_phases: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(code: Option<i32>, signal: Option<i32>, pass: bool) -> Facts {
        Facts {
            code,
            signal,
            intervention: None,
            frames_pass: pass,
            completion_reason: (!pass).then(|| "frame 0: near-black".to_string()),
            open_phases: vec![],
        }
    }

    #[test]
    fn pixels_decide_when_the_harness_did_not_intervene() {
        assert_eq!(
            classify(&facts(Some(0), None, true)).reason,
            Reason::Completed
        );
        let e = classify(&facts(Some(0), None, false));
        assert_eq!(e.reason, Reason::EngineFailed);
        assert!(
            e.detail.contains("code 0") && e.detail.contains("near-black"),
            "{}",
            e.detail
        );
        let e = classify(&facts(Some(127), None, true));
        assert_eq!(e.reason, Reason::Completed);
        assert!(e.detail.contains("127"));
        assert_eq!(
            classify(&facts(Some(1), None, false)).reason,
            Reason::EngineFailed
        );
        let e = classify(&facts(None, Some(libc::SIGKILL), false));
        assert_eq!((e.reason, e.signal), (Reason::Killed, Some(9)));
        assert!(e.detail.contains("SIGKILL"));
    }

    #[test]
    fn interventions_win_and_name_the_open_phase() {
        let trip = Trip {
            column: "mem_available_bytes".into(),
            value: 10,
            limit: 20,
            t_ns: 1,
        };
        let mut f = facts(None, Some(libc::SIGKILL), true);
        f.open_phases = vec!["denoise".into(), "denoise.step".into()];
        f.intervention = Some(Intervention::Watchdog(trip));
        let e = classify(&f);
        assert_eq!(e.reason, Reason::Watchdog);
        assert!(
            e.detail.contains("during denoise > denoise.step"),
            "{}",
            e.detail
        );
        assert!(
            e.detail.contains("mem_available_bytes = 10 B"),
            "{}",
            e.detail
        );
        f.intervention = Some(Intervention::Timeout(2.5));
        assert_eq!(classify(&f).reason, Reason::Timeout);
        f.intervention = Some(Intervention::Interrupted("SIGINT"));
        let e = classify(&f);
        assert_eq!(e.reason, Reason::Interrupted);
        assert!(e.detail.contains("partial"));
        assert_eq!(e.open_phases, ["denoise", "denoise.step"]);
    }

    #[test]
    fn reasons_serialise_as_the_contract_spells_them() {
        let v = serde_json::to_value(refused("lease", "no lease id")).unwrap();
        assert_eq!(v["reason"], "gate-refused");
        assert_eq!(
            serde_json::to_value(Reason::EngineFailed).unwrap(),
            "engine-failed"
        );
        // as_str (the fragment's and the log's spelling) and serde agree on every reason.
        for r in [
            Reason::Completed,
            Reason::EngineFailed,
            Reason::Killed,
            Reason::Watchdog,
            Reason::Timeout,
            Reason::Interrupted,
            Reason::GateRefused,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "{r:?}");
        }
    }
}
