//! `harness run`'s command line, in two stages: the raw flags (clap), then a
//! validated [`RunConfig`] of the run (every value checked, every error naming the
//! flag), which [`crate::run::run`] carries out.

use std::path::{Path, PathBuf};

use clap::Args;
use evidence::rung::{Profile, Rung};

use crate::exit::UsageError;
use crate::run::config::{Engine, RunConfig};
use crate::sampler::{DEFAULT_CADENCE_MS, MAX_CADENCE_MS, MIN_CADENCE_MS};
use crate::units::parse_bytes;

/// Render a rung (or run any protocol-speaking engine) under the instrument.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The rung file (`rungs/N.toml`). Required unless --exec is given.
    #[arg(long, value_name = "FILE")]
    pub rung: Option<PathBuf>,
    /// The evidence store (default: $HARNESS_STORE, then $XDG_DATA_HOME/harness/store,
    /// then ~/.local/share/harness/store). Must be durable storage.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// A lever's arm, overriding the rung and the profile (repeatable).
    #[arg(long = "lever", value_name = "K=V")]
    pub levers: Vec<String>,
    /// Lever defaults: default (best arms) or baseline (the old state).
    #[arg(long, value_name = "P")]
    pub profile: Option<String>,
    /// The engine binary (default: `engine` next to the harness binary).
    #[arg(long, value_name = "PATH")]
    pub engine: Option<PathBuf>,
    /// The weights directory (default: the rung's, else synthesized into the cache).
    #[arg(long, value_name = "DIR")]
    pub weights: Option<PathBuf>,
    /// Sampler interval in milliseconds (10 to 10000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CADENCE_MS)]
    pub cadence_ms: u64,
    /// Kill the engine when MemAvailable falls below this (e.g. 4GiB).
    /// Default: the smaller of 4 GiB and an eighth of RAM.
    #[arg(long, value_name = "BYTES")]
    pub mem_floor: Option<String>,
    /// Kill the engine when RSS + weights page cache + GPU memory exceeds this.
    /// Default on unified-memory GPUs: MemTotal minus the floor; otherwise none.
    #[arg(long, value_name = "BYTES")]
    pub unified_budget: Option<String>,
    /// Stop the engine after this many seconds.
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    pub timeout: Option<f64>,
    /// The lease this run measures under (H3).
    #[arg(long, value_name = "ID", env = "HARNESS_LEASE_ID")]
    pub lease_id: Option<String>,
    /// Sample and journal every column (on, the default), or only what the
    /// watchdog needs (off). Also set by `--lever observer=on|off`, which records
    /// it among the levers; the two must agree when both are given.
    #[arg(long, value_name = "on|off")]
    pub observer: Option<String>,
    /// The weight files' page-cache state when the engine starts: as-is (what the
    /// previous run left), cold (evicted) or warm (read once). Measured and recorded
    /// in the `weights-cache` gate; a state that cannot be reached refuses the run.
    #[arg(
        long,
        value_enum,
        value_name = "as-is|cold|warm",
        default_value = "as-is"
    )]
    pub weights_cache: crate::weights_cache::Policy,
    /// Before the engine starts, wait up to this many seconds for the host to
    /// go quiet (other work on at most half the cores), reading it again every
    /// 500 ms; the run is flagged contended only if the last reading is still
    /// busy, and the `contention` fragment records the wait. 0 (the default)
    /// judges the first reading. A campaign passes it after `--`.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    pub quiet_wait_s: f64,
    /// Run CMD ARGS (any engine that speaks the marker protocol) instead of the
    /// engine's `render`: `harness run --exec -- CMD ARGS...`.
    #[arg(long)]
    pub exec: bool,
    /// The campaign's `schedule` fragment for this run (a JSON object; set by
    /// `harness campaign`, recorded verbatim in the manifest).
    #[arg(long, value_name = "JSON", hide = true)]
    pub schedule: Option<String>,
    /// The command after `--` (with --exec).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The longest `--quiet-wait-s`, seconds: an hour.
pub const MAX_QUIET_WAIT_S: f64 = 3600.0;

fn usage(msg: String) -> anyhow::Error {
    UsageError(msg).into()
}

/// The default engine: `engine` in the harness binary's directory.
pub fn default_engine() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("engine")))
        .unwrap_or_else(|| PathBuf::from("engine"))
}

/// `harness run`: validate the flags, then run; returns the exit code.
pub fn run(args: &RunArgs) -> anyhow::Result<u8> {
    crate::run::run(&args.validate()?)
}

impl RunArgs {
    /// Check every flag and load the rung.
    pub fn validate(&self) -> anyhow::Result<RunConfig> {
        let rung = match &self.rung {
            Some(p) => Some((p.clone(), Rung::load(p).map_err(|e| usage(e.to_string()))?)),
            None => None,
        };
        let engine = if self.exec {
            let Some((program, args)) = self.command.split_first() else {
                return Err(usage(
                    "--exec needs a command after `--`: harness run --exec -- CMD ARGS...".into(),
                ));
            };
            if self.engine.is_some() {
                return Err(usage("--engine and --exec exclude each other".into()));
            }
            Engine::Exec {
                program: program.into(),
                args: args.to_vec(),
            }
        } else {
            if !self.command.is_empty() {
                return Err(usage(format!(
                    "a command after `--` ({:?}) needs --exec",
                    self.command[0]
                )));
            }
            if rung.is_none() {
                return Err(usage(
                    "--rung FILE is required (or --exec -- CMD ARGS...)".into(),
                ));
            }
            Engine::Render {
                binary: self.engine.clone().unwrap_or_else(default_engine),
            }
        };
        let mut levers = rung
            .as_ref()
            .map(|(_, r)| r.levers.clone())
            .unwrap_or_default();
        for kv in &self.levers {
            match kv.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                    levers.insert(k.trim().to_string(), v.trim().to_string());
                }
                _ => return Err(usage(format!("--lever {kv:?}: expected NAME=ARM"))),
            }
        }
        let profile = match (&self.profile, &rung) {
            (Some(p), _) if p == "default" || p == "baseline" => p.clone(),
            (Some(p), _) => {
                return Err(usage(format!(
                    "--profile {p:?}: expected default or baseline"
                )))
            }
            (None, Some((_, r))) => match r.profile {
                Profile::Default => "default".into(),
                Profile::Baseline => "baseline".into(),
            },
            (None, None) => "default".into(),
        };
        if !(MIN_CADENCE_MS..=MAX_CADENCE_MS).contains(&self.cadence_ms) {
            return Err(usage(format!(
                "--cadence-ms {}: expected {MIN_CADENCE_MS} to {MAX_CADENCE_MS}",
                self.cadence_ms
            )));
        }
        let bytes = |flag: &str, v: &Option<String>| -> anyhow::Result<Option<u64>> {
            v.as_deref()
                .map(|s| parse_bytes(s).map_err(|e| usage(format!("--{flag}: {e}"))))
                .transpose()
        };
        let mem_floor = bytes("mem-floor", &self.mem_floor)?;
        let unified_budget = bytes("unified-budget", &self.unified_budget)?;
        if unified_budget == Some(0) {
            return Err(usage(
                "--unified-budget 0: expected a positive budget".into(),
            ));
        }
        if let Some(t) = self.timeout {
            if !(t.is_finite() && t > 0.0) {
                return Err(usage(format!("--timeout {t}: expected seconds above 0")));
            }
        }
        if !(self.quiet_wait_s.is_finite() && (0.0..=MAX_QUIET_WAIT_S).contains(&self.quiet_wait_s))
        {
            return Err(usage(format!(
                "--quiet-wait-s {}: expected 0 to {MAX_QUIET_WAIT_S} seconds",
                self.quiet_wait_s
            )));
        }
        let observer = observer(self.observer.as_deref(), &levers)?;
        let weights = self
            .weights
            .clone()
            .or_else(|| rung.as_ref().and_then(|(p, r)| rung_weights(p, r)));
        let schedule = match &self.schedule {
            None => None,
            Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v @ serde_json::Value::Object(_)) => Some(v),
                Ok(_) => {
                    return Err(usage(format!(
                        "--schedule {text:?}: expected a JSON object"
                    )))
                }
                Err(e) => return Err(usage(format!("--schedule {text:?}: not JSON: {e}"))),
            },
        };
        Ok(RunConfig {
            rung,
            schedule,
            store: self.store.clone(),
            levers,
            profile,
            engine,
            weights,
            cadence_ms: self.cadence_ms,
            mem_floor,
            unified_budget,
            timeout_s: self.timeout,
            lease_id: self.lease_id.clone(),
            lease_node: crate::campaign::slurm::task::node_from_env(),
            observer,
            weights_cache: self.weights_cache,
            quiet_wait_s: self.quiet_wait_s,
        })
    }
}

/// Whether the observer is on: from `--observer` and the `observer` lever (the
/// rung's or `--lever observer=ARM`, applied by the harness: see
/// [`crate::harness_levers`]), which must agree when both are given; on by default.
fn observer(
    flag: Option<&str>,
    levers: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<bool> {
    let on = |what: &str, v: &str| match v {
        "on" => Ok(true),
        "off" => Ok(false),
        o => Err(usage(format!("{what} {o:?}: expected on or off"))),
    };
    let flag = flag.map(|f| on("--observer", f)).transpose()?;
    let lever = levers
        .get(crate::harness_levers::OBSERVER)
        .map(|v| on("--lever observer=", v))
        .transpose()?;
    match (flag, lever) {
        (Some(f), Some(l)) if f != l => Err(usage(format!(
            "--observer {} and --lever observer={} disagree",
            if f { "on" } else { "off" },
            if l { "on" } else { "off" }
        ))),
        (f, l) => Ok(l.or(f).unwrap_or(true)),
    }
}

/// The rung's `weights`, relative paths taken from the rung file's directory.
fn rung_weights(rung_path: &Path, rung: &Rung) -> Option<PathBuf> {
    let w = rung.weights.as_ref()?;
    Some(if w.is_absolute() {
        w.clone()
    } else {
        rung_path.parent().unwrap_or(Path::new(".")).join(w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: RunArgs,
    }

    fn parse(args: &[&str]) -> anyhow::Result<RunConfig> {
        let mut v = vec!["run"];
        v.extend_from_slice(args);
        T::try_parse_from(v)?.a.validate()
    }

    /// A rung file of its own for each call: the tests run in parallel, and a
    /// shared file rewritten by one was read empty by another.
    fn rung_file() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/args");
        std::fs::create_dir_all(&d).unwrap();
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = d.join(format!("r-{}-{n}.toml", std::process::id()));
        std::fs::write(
            &p,
            "preset = \"tiny\"\nwidth = 64\nheight = 64\nframes = 9\nsteps = 2\nguidance = 1.0\n\
             seed = 1\ndevice = \"cpu\"\nprofile = \"baseline\"\nweights = \"w\"\n[levers]\nstaging = \"serial\"\n",
        )
        .unwrap();
        p
    }

    #[test]
    fn a_rung_run_merges_levers_and_resolves_weights() {
        let r = rung_file();
        let p = parse(&[
            "--rung",
            r.to_str().unwrap(),
            "--lever",
            "staging=batched",
            "--lever",
            "vae=device",
            "--mem-floor",
            "2GiB",
        ])
        .unwrap();
        assert_eq!(p.levers["staging"], "batched");
        assert_eq!(p.levers["vae"], "device");
        assert_eq!(p.profile, "baseline");
        assert_eq!(p.mem_floor, Some(2 << 30));
        assert_eq!(p.weights, Some(r.parent().unwrap().join("w")));
        assert!(matches!(p.engine, Engine::Render { .. }));
        assert!(p.observer);
        assert_eq!(p.cadence_ms, 100);
    }

    #[test]
    fn quiet_wait_is_seconds_from_0_to_an_hour() {
        let r = rung_file();
        let r = r.to_str().unwrap();
        assert_eq!(parse(&["--rung", r]).unwrap().quiet_wait_s, 0.0);
        assert_eq!(
            parse(&["--rung", r, "--quiet-wait-s", "90"])
                .unwrap()
                .quiet_wait_s,
            90.0
        );
        for bad in ["-1", "NaN", "inf", "3601"] {
            let e = parse(&["--rung", r, &format!("--quiet-wait-s={bad}")]).unwrap_err();
            assert!(
                e.to_string().contains("--quiet-wait-s") && e.to_string().contains("0 to 3600"),
                "{bad}: {e}"
            );
        }
    }

    /// The observer lever sets the observer and stays among the levers (recorded,
    /// ranked); the flag alone sets it without recording a lever.
    #[test]
    fn the_observer_lever_sets_the_observer_and_is_recorded_as_a_lever() {
        let r = rung_file();
        let r = r.to_str().unwrap();
        let p = parse(&["--rung", r, "--lever", "observer=off"]).unwrap();
        assert!(!p.observer);
        assert_eq!(p.levers["observer"], "off");
        let p = parse(&["--rung", r, "--observer", "off", "--lever", "observer=off"]).unwrap();
        assert!(!p.observer);
        let p = parse(&["--rung", r, "--observer", "off"]).unwrap();
        assert!(!p.observer);
        assert!(!p.levers.contains_key("observer"));
        assert!(parse(&["--rung", r]).unwrap().observer);
    }

    #[test]
    fn exec_takes_the_command_after_the_separator() {
        let p = parse(&["--exec", "--", "my-engine", "--flag", "x"]).unwrap();
        assert_eq!(
            p.engine,
            Engine::Exec {
                program: "my-engine".into(),
                args: vec!["--flag".into(), "x".into()]
            }
        );
        assert!(p.rung.is_none());
    }

    #[test]
    fn a_campaign_schedule_is_carried_verbatim() {
        let r = rung_file();
        let p = parse(&[
            "--rung",
            r.to_str().unwrap(),
            "--schedule",
            r#"{"campaign":"c1","position":3}"#,
        ])
        .unwrap();
        assert_eq!(
            p.schedule,
            Some(serde_json::json!({"campaign": "c1", "position": 3}))
        );
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_flag() {
        let r = rung_file();
        let r = r.to_str().unwrap();
        for (args, want) in [
            (vec!["--exec"], "--exec needs a command"),
            (vec![], "--rung FILE is required"),
            (vec!["--rung", r, "--cadence-ms", "5"], "--cadence-ms 5"),
            (
                vec!["--rung", r, "--lever", "novalue"],
                "--lever \"novalue\"",
            ),
            (vec!["--rung", r, "--profile", "fast"], "--profile \"fast\""),
            (vec!["--rung", r, "--mem-floor", "lots"], "--mem-floor"),
            (vec!["--rung", r, "--timeout", "-1"], "--timeout -1"),
            (vec!["--rung", r, "--observer", "maybe"], "--observer"),
            (
                vec!["--rung", r, "--lever", "observer=maybe"],
                "--lever observer= \"maybe\"",
            ),
            (
                vec!["--rung", r, "--observer", "on", "--lever", "observer=off"],
                "disagree",
            ),
            (vec!["--rung", "no/such.toml"], "no/such.toml"),
            (vec!["--engine", "e", "--exec", "--", "x"], "exclude"),
            (
                vec!["--rung", r, "--schedule", "[1]"],
                "expected a JSON object",
            ),
            (vec!["--rung", r, "--schedule", "{pos"], "not JSON"),
        ] {
            let e = parse(&args).unwrap_err();
            assert!(e.is::<UsageError>(), "{args:?}: {e}");
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
    }
}
