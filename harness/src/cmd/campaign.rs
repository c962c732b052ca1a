//! `harness campaign`: its arguments, and the command that plans the schedule,
//! prints it with what is already done, and runs what is not (see
//! [`crate::campaign`]). Exit 0 when every position ran complete; 1 when a run was
//! incomplete or the campaign stopped (interrupted, or the budget); 3 when a gate
//! refused a run; 2 for bad arguments, spec, rung files or engine.

use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::bundle::facts::Bundle;
use crate::bundle::{files, manifest};
use crate::campaign::budget::{Budget, WallHistory};
use crate::campaign::execute::{execute, CampaignOutcome};
use crate::campaign::plan::{self, Order, Plan, RungRef, Skip};
use crate::campaign::runner::ChildRunner;
use crate::exit::{self, UsageError};
use crate::levers_spec::{DeviceKind, Lever, LeverSpec, DEFAULT_SPEC};
use crate::verification::local::{partition, VerifyCache};
use crate::weights_cache::Policy as WeightsCache;

/// `harness campaign`: interleave every selected lever's arms over rounds.
#[derive(Debug, clap::Args)]
pub struct CampaignArgs {
    /// Rungs, comma-separated: names (`0` = `rungs/0.toml`) or rung file paths.
    #[arg(long, default_value = "0,2")]
    pub rungs: String,
    /// Levers: `all` or comma-separated ids from the spec.
    #[arg(long, default_value = "all")]
    pub levers: String,
    /// Rounds per lever and rung.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// Seed of the arm order (recorded in every bundle's `schedule`).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Arm order within a round.
    #[arg(long, value_enum, default_value = "random")]
    pub order: Order,
    /// The engine binary every run uses (hashed into the campaign id).
    /// Default: `engine` next to the harness binary, as for `harness run`.
    #[arg(long, default_value_os_t = crate::cmd::run::default_engine())]
    pub engine: PathBuf,
    /// The weights' page-cache state at the start of every run (`harness run
    /// --weights-cache`); anything but as-is is part of the campaign id. Use cold
    /// (or warm) for a lever whose metric reads the weights, so that no run inherits
    /// the state its predecessor left.
    #[arg(
        long,
        value_enum,
        value_name = "as-is|cold|warm",
        default_value = "as-is"
    )]
    pub weights_cache: WeightsCache,
    /// Throw-away runs per rung before its first round (same engine, weights,
    /// profile, and the lever arm that runs first there), sealed with
    /// `schedule.warmup` and never paired by rank. Default: 1 on a rung whose
    /// device is cuda, 0 on a cpu rung. Any warm-up is part of the campaign id
    /// (`--warmup 0` resumes a campaign begun before this flag).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// The lever spec.
    #[arg(long, default_value = DEFAULT_SPEC)]
    pub spec: PathBuf,
    /// The store (same default as `rank`); sealed positions there are skipped.
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Print the schedule and what is already done, run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Seconds this invocation may take (a lease or device session's end): stop,
    /// before starting it, at the first position expected to end later. Expected =
    /// the longest complete run of the same rung and arm in this campaign (sealed
    /// before, or in this invocation), else of the same rung; a position with
    /// neither starts. Rerun to resume.
    #[arg(long, value_name = "SECONDS")]
    pub budget_s: Option<f64>,
    /// Extra `harness run` flags for every run, after `--`
    /// (e.g. `-- --cadence-ms 50 --timeout 600`).
    #[arg(last = true, value_name = "RUN_FLAGS")]
    pub run_flags: Vec<String>,
}

/// sha256 of a file the campaign names (a rung file, the engine), hex; an
/// unreadable file is an input error.
fn sha256_file(p: &Path) -> anyhow::Result<String> {
    evidence::weights_digest::sha256_file(p)
        .map_err(|e| UsageError(format!("{}: cannot read: {e}", p.display())).into())
}

/// The rung references of a `--rungs` argument.
pub fn campaign_rungs(arg: &str) -> anyhow::Result<Vec<RungRef>> {
    let mut out = Vec::new();
    for item in arg.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let path = if item.ends_with(".toml") {
            PathBuf::from(item)
        } else {
            Path::new("rungs").join(format!("{item}.toml"))
        };
        let rung =
            evidence::rung::Rung::load(&path).map_err(|e| UsageError(format!("--rungs: {e}")))?;
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| UsageError(format!("--rungs: {} has no file name", path.display())))?
            .to_string();
        out.push(RungRef {
            name,
            sha256: sha256_file(&path)?,
            device: match rung.device {
                evidence::rung::Device::Cpu => DeviceKind::Cpu,
                evidence::rung::Device::Cuda => DeviceKind::Cuda,
            },
            path,
        });
    }
    if out.is_empty() {
        return Err(UsageError("--rungs: expected at least one rung".into()).into());
    }
    Ok(out)
}

/// The engine's levers and their arms, from `ENGINE levers --json`.
pub fn engine_levers(engine: &Path) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let out = std::process::Command::new(engine)
        .args(["levers", "--json"])
        .output()
        .map_err(|e| UsageError(format!("--engine {}: cannot run: {e}", engine.display())))?;
    if !out.status.success() {
        return Err(UsageError(format!(
            "--engine {}: `levers --json` exited {}: {}",
            engine.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .into());
    }
    parse_engine_levers(&out.stdout).map_err(|why| {
        UsageError(format!(
            "--engine {}: `levers --json`: {why}",
            engine.display()
        ))
        .into()
    })
}

/// Parse `{"levers": {ID: {"arms": [..], ..}, ..}}`.
pub fn parse_engine_levers(json: &[u8]) -> Result<BTreeMap<String, Vec<String>>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let map = v["levers"] // not a manifest: `engine levers --json`
        .as_object()
        .ok_or("field 'levers': expected an object of levers")?;
    let mut out = BTreeMap::new();
    for (id, l) in map {
        let arms = l["arms"]
            .as_array()
            .ok_or_else(|| format!("field 'levers.{id}.arms': expected a list of arm names"))?
            .iter()
            .map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("field 'levers.{id}.arms': expected strings"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert(id.clone(), arms);
    }
    Ok(out)
}

/// Split the selected levers into those that can be applied (the engine implements
/// them, or the harness applies them itself: [`crate::harness_levers`]) and the ids
/// of those that cannot; an arm the spec names but the lever lacks is an error
/// naming the spec, the lever and its arms.
pub fn reconcile<'a>(
    spec: &Path,
    levers: Vec<&'a Lever>,
    registry: &BTreeMap<String, Vec<String>>,
) -> anyhow::Result<(Vec<&'a Lever>, Vec<String>)> {
    let mut have = Vec::new();
    let mut missing = Vec::new();
    for l in levers {
        let harness_arms = crate::harness_levers::arms(&l.id)
            .map(|a| a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let Some(arms) = harness_arms.as_ref().or_else(|| registry.get(&l.id)) else {
            missing.push(l.id.clone());
            continue;
        };
        for arm in [&l.baseline, &l.treatment] {
            if !arms.contains(arm) {
                return Err(UsageError(format!(
                    "{}: lever '{}' arm '{arm}': the engine's arms are {}",
                    spec.display(),
                    l.id,
                    arms.join("|")
                ))
                .into());
            }
        }
        have.push(l);
    }
    Ok((have, missing))
}

/// The schedule `args` ask for, with its rungs, the levers the engine implements
/// and the engine binary's sha256; levers the engine lacks are listed as skipped.
fn schedule(args: &CampaignArgs) -> anyhow::Result<(Plan, Vec<RungRef>, Vec<Lever>, String)> {
    let spec = LeverSpec::load(&args.spec).map_err(|e| UsageError(e.to_string()))?;
    let levers = spec.select(&args.levers).map_err(UsageError)?;
    if args.repeat == 0 {
        return Err(UsageError("--repeat: expected at least 1 round".into()).into());
    }
    let rungs = campaign_rungs(&args.rungs)?;
    let engine = sha256_file(&args.engine)?;
    // Only levers this engine implements can be measured; the others are listed
    // as skipped. An arm the spec names but the engine lacks is an error.
    let registry = engine_levers(&args.engine)?;
    let (levers, missing) = reconcile(&args.spec, levers, &registry)?;
    let mut plan = plan::with_warmups(
        plan::plan(
            &engine,
            &rungs,
            &levers,
            args.repeat,
            args.order,
            args.seed,
            args.weights_cache,
        ),
        &rungs,
        args.warmup,
    );
    for l in &missing {
        for r in &rungs {
            plan.skipped.push(Skip {
                lever: l.clone(),
                rung: r.name.clone(),
                why: format!(
                    "the engine ({}) has no lever '{l}' yet",
                    crate::short_id::short(&engine)
                ),
            });
        }
    }
    let levers = levers.into_iter().cloned().collect();
    Ok((plan, rungs, levers, engine))
}

/// The manifest facts of every bundle already sealed in the store at `root`
/// (none when the store cannot be listed yet).
fn sealed_bundles(root: &Path) -> Vec<Bundle> {
    let Ok(dirs) = files::store_bundle_dirs(root) else {
        return Vec::new();
    };
    // A position counts as sealed only by a bundle that verifies; one that does
    // not is named here and its position runs again.
    let (ok, bad) = partition(&dirs, &mut VerifyCache::in_process());
    for b in &bad {
        eprintln!("harness campaign: not counted: {}: {}", b.id, b.reason);
    }
    ok.iter()
        .filter_map(|d| manifest::read_facts(d).ok())
        .collect()
}

/// Print the plan: its header, skips and warnings, every position (done or todo,
/// with its expected wall under a budget), and what the budget is expected to fit.
fn print_plan(
    args: &CampaignArgs,
    plan: &Plan,
    engine: &str,
    levers: &[Lever],
    done: &BTreeSet<u32>,
    budget: &Budget,
) {
    println!(
        "campaign {} (engine {}, order {}, seed {}, weights cache {}): {} runs over {} round(s), {} already sealed",
        plan.id,
        crate::short_id::short(engine),
        plan.order.as_str(),
        plan.seed,
        args.weights_cache.as_str(),
        plan.entries.len(),
        plan.repeat,
        done.len()
    );
    for s in &plan.skipped {
        println!("  skip {} at rung {}: {}", s.lever, s.rung, s.why);
    }
    let lever_refs: Vec<&Lever> = levers.iter().collect();
    for w in plan::cache_warnings(&lever_refs, args.weights_cache) {
        println!("  warning: {w}");
    }
    // With a budget, each position to run shows what it is expected to take and
    // when (cumulatively) it would end, from the walls already sealed.
    let (mut planned_s, mut fit, mut unknown, mut to_run) = (0.0, 0, 0, 0);
    for e in &plan.entries {
        let is_done = done.contains(&e.position);
        let mut eta = String::new();
        if let (false, Some(limit)) = (is_done, args.budget_s) {
            to_run += 1;
            match budget.history.expected(e) {
                Some(x) => {
                    planned_s += x.wall_s;
                    if planned_s <= limit {
                        fit += 1;
                    }
                    eta = format!("  ~{:.0} s, ends ~{planned_s:.0} s in", x.wall_s);
                }
                None => {
                    unknown += 1;
                    eta = "  ~? s (no complete run of this rung yet)".into();
                }
            }
        }
        println!(
            "  {:>4} {} rung {} {}={} {}{eta}",
            e.position,
            if e.warmup {
                "warm-up ".to_string()
            } else {
                format!("round {:>2}", e.round)
            },
            e.rung,
            e.lever,
            e.arm,
            if is_done { "done" } else { "todo" }
        );
    }
    if let Some(s) = args.budget_s {
        println!(
            "budget {s:.0} s: {fit} of {to_run} positions to run expected to fit by the walls \
             sealed so far; {unknown} have no history (they start, and teach it)"
        );
    }
}

/// The runner that starts each position as a child `harness run` into the store at
/// `root`, with the cache policy and the extra run flags of `args`, passing the
/// campaign's own signals on to the running child.
fn child_runner(
    args: &CampaignArgs,
    root: PathBuf,
    remote: Option<&crate::remote::S3Location>,
) -> anyhow::Result<ChildRunner> {
    let harness = std::env::current_exe().context("locating the harness binary")?;
    let signals = crate::run::signals::Signals::install().context("installing signal handlers")?;
    let mut extra = Vec::new();
    if args.weights_cache != WeightsCache::AsIs {
        extra.push("--weights-cache".to_string());
        extra.push(args.weights_cache.as_str().to_string());
    }
    extra.extend(args.run_flags.iter().cloned());
    Ok(ChildRunner {
        harness,
        engine: args.engine.clone(),
        store: remote.map_or(root.clone(), |l| PathBuf::from(l.to_string())),
        local_store: remote.map(|_| root),
        extra,
        signals: Some(std::sync::Arc::new(signals)),
    })
}

/// Print how the campaign ended; returns the exit code.
fn report_outcome(out: &CampaignOutcome) -> u8 {
    println!(
        "campaign {}: {} sealed complete, {} incomplete, {} already done, {} remaining",
        out.campaign,
        out.completed.len(),
        out.incomplete.len(),
        out.skipped_done,
        out.remaining
    );
    match &out.stopped {
        Some(why) => {
            println!("stopped: {why}");
            println!("resume: rerun the same command; sealed positions are skipped");
            if why.contains("refused by gate") {
                exit::REFUSED
            } else {
                exit::NEGATIVE
            }
        }
        None if out.incomplete.is_empty() => exit::OK,
        None => exit::NEGATIVE,
    }
}

/// Run `harness campaign`; returns the exit code.
pub fn run(args: &CampaignArgs) -> anyhow::Result<u8> {
    let t0 = evidence::clock::monotonic_ns();
    let (plan, rungs, levers, engine) = schedule(args)?;
    if let Some(b) = args.budget_s {
        if !(b.is_finite() && b > 0.0) {
            return Err(UsageError(format!(
                "--budget-s: expected a positive number of seconds, got {b}"
            ))
            .into());
        }
    }
    // With a bucket, runs seal into this machine's local store (where the
    // campaign resumes from) and publish to the bucket one by one.
    let remote = crate::remote::location_of(args.store.as_deref())?;
    let root = match &remote {
        Some(_) => crate::remote::local_store()?.root().to_path_buf(),
        None => crate::store_arg::read_root(args.store.as_deref())?,
    };
    let sealed = sealed_bundles(&root);
    let done = plan::done_positions(&plan, &sealed);
    // Always learned, for the progress lines; without --budget-s the deadline is
    // infinitely far and nothing is refused.
    let mut budget = Budget::new(
        t0,
        args.budget_s.unwrap_or(f64::INFINITY),
        WallHistory::from_bundles(&plan, &sealed),
    );
    print_plan(args, &plan, &engine, &levers, &done, &budget);
    if args.dry_run {
        return Ok(exit::OK);
    }
    let mut runner = child_runner(args, root, remote.as_ref())?;
    let out = execute(
        &plan,
        &rungs,
        &done,
        &mut runner,
        Some(&mut budget),
        |e, what| {
            eprintln!(
                "campaign: position {} ({}, rung {}, {}={}): {what}",
                e.position,
                e.round_label(),
                e.rung,
                e.lever,
                e.arm
            );
        },
    )?;
    Ok(report_outcome(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The observer is applied by the harness: an engine that lists no such lever
    /// still runs it (mutation: drop the harness-lever lookup and it is skipped as
    /// missing); an engine lever it lacks is still missing.
    #[test]
    fn a_harness_applied_lever_needs_no_engine_support() {
        let spec = crate::campaign::plan::tests::spec();
        let levers = spec.select("observer,staging").unwrap();
        let (have, missing) =
            reconcile(Path::new("specs/levers.toml"), levers, &BTreeMap::new()).unwrap();
        let ids: Vec<&str> = have.iter().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["observer"]);
        assert_eq!(missing, ["staging"]);
    }
}
