//! `harness campaign`: its arguments, and the command that plans the schedule,
//! prints it with what is already done, and runs what is not (see
//! [`crate::campaign`]). Exit 0 when every position ran complete; 1 when a run was
//! incomplete or the campaign stopped (interrupted, or the budget); 3 when a gate
//! refused a run; 2 for bad arguments, spec, rung files or engine.
//!
//! With `--scheduler slurm` ([`crate::campaign::slurm`]) it submits the rounds
//! not yet sealed as an sbatch array (exit 0 once submitted, or when nothing is
//! left; 2 when sbatch is missing or refuses), with `--status` reports the
//! array's tasks and the bucket's positions (0 when every position is sealed, 1
//! when not), and inside an array task (`--slurm-task`, which the script passes)
//! runs its round as above.

use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::campaign::budget::{Budget, WallHistory};
use crate::campaign::execute::{execute, CampaignOutcome};
use crate::campaign::plan::{self, Order, Plan, RungRef, Skip};
use crate::campaign::runner::ChildRunner;
use crate::campaign::sealed;
use crate::campaign::slurm::commands::{self as slurm_cmd, Accounting};
use crate::campaign::slurm::script::{self as slurm_script, ArrayJob, SlurmOptions};
use crate::campaign::slurm::task::ArrayTask;
use crate::campaign::slurm::{status as slurm_status, SlurmError};
use crate::exit::{self, UsageError};
use crate::levers_spec::{DeviceKind, Lever, LeverSpec, DEFAULT_SPEC};
use crate::weights_cache::Policy as WeightsCache;

/// Where a campaign's rounds run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheduler {
    /// On this machine, one position after another.
    Local,
    /// As a Slurm job array, one task per round, on whichever nodes Slurm gives.
    Slurm,
}

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
    /// Where the rounds run: local (here, one after another) or slurm (an sbatch
    /// array written into `<local store>/campaigns/<id>/` and submitted, one task
    /// per round not yet sealed; each task runs its round on its node and
    /// publishes every run to the `--store s3://...` bucket, which it needs;
    /// rerun the same command to resubmit what is missing).
    #[arg(long, value_enum, default_value = "local")]
    pub scheduler: Scheduler,
    /// `--scheduler slurm`: the partition (`#SBATCH --partition`).
    #[arg(long, value_name = "NAME")]
    pub partition: Option<String>,
    /// `--scheduler slurm`: generic resources per task (`#SBATCH --gres`, e.g.
    /// `gpu:1`).
    #[arg(long, value_name = "GRES")]
    pub gres: Option<String>,
    /// `--scheduler slurm`: the time limit per task (`#SBATCH --time`, Slurm's
    /// formats: minutes, `HH:MM:SS`, `D-HH:MM`).
    #[arg(long, value_name = "TIME")]
    pub time: Option<String>,
    /// `--scheduler slurm`: at most N of the array's tasks running at once
    /// (sbatch's array throttle, `--array=...%N`), e.g. to cap how many nodes
    /// or GPUs the campaign takes from a shared partition; N >= 1. Default: no
    /// cap, as many as Slurm gives nodes for. It throttles one submission's
    /// array: a resubmission while an earlier array still runs is its own.
    #[arg(long, value_name = "N")]
    pub max_parallel: Option<u32>,
    /// `--scheduler slurm`: print each round's array tasks (squeue, sacct) and
    /// its positions sealed in the bucket; submit nothing. Exit 0 when every
    /// position is sealed, 1 when not.
    #[arg(long)]
    pub status: bool,
    /// Run as one task of the array this command submitted: the round from
    /// `SLURM_ARRAY_TASK_ID`, the lease from the job and task ids.
    #[arg(long, hide = true)]
    pub slurm_task: bool,
    /// With `--slurm-task`: the campaign id the array was submitted for (a node
    /// whose engine or rung files differ computes another id and refuses).
    #[arg(long, hide = true, value_name = "ID")]
    pub expect_campaign: Option<String>,
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

/// The arms of lever `id` as applied: the harness's own ([`crate::harness_levers`])
/// or the engine's registry's; `None` when neither knows the lever.
fn applied_arms(id: &str, registry: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    crate::harness_levers::arms(id)
        .map(|a| a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .or_else(|| registry.get(id).cloned())
}

/// Split the selected levers into those that can be applied (the engine implements
/// them, or the harness applies them itself: [`crate::harness_levers`]) and the ids
/// of those that cannot; an arm the spec names but the lever lacks is an error
/// naming the spec, the lever and its arms, and so is a `with` setting of an
/// applicable lever whose lever or arm neither the engine nor the harness has
/// (every run of the lever would be refused).
pub fn reconcile<'a>(
    spec: &Path,
    levers: Vec<&'a Lever>,
    registry: &BTreeMap<String, Vec<String>>,
) -> anyhow::Result<(Vec<&'a Lever>, Vec<String>)> {
    let mut have = Vec::new();
    let mut missing = Vec::new();
    for l in levers {
        let Some(arms) = applied_arms(&l.id, registry) else {
            missing.push(l.id.clone());
            continue;
        };
        for (k, v) in &l.with {
            let why = match applied_arms(k, registry) {
                None => format!("the engine has no lever '{k}'"),
                Some(a) if !a.contains(v) => format!("the engine's arms are {}", a.join("|")),
                Some(_) => continue,
            };
            return Err(UsageError(format!(
                "{}: lever '{}' with.{k} = '{v}': {why}",
                spec.display(),
                l.id
            ))
            .into());
        }
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
            "  {:>4} {} rung {} {}={}{} {}{eta}",
            e.position,
            if e.warmup {
                "warm-up ".to_string()
            } else {
                format!("round {:>2}", e.round)
            },
            e.rung,
            e.lever,
            e.arm,
            e.with_label(),
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
    lease: Option<String>,
) -> anyhow::Result<ChildRunner> {
    let harness = std::env::current_exe().context("locating the harness binary")?;
    let signals = crate::run::signals::Signals::install().context("installing signal handlers")?;
    let mut extra = Vec::new();
    if let Some(l) = lease {
        extra.push("--lease-id".to_string());
        extra.push(l);
    }
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
    check_scheduler_flags(args)?;
    let (plan, rungs, levers, engine) = schedule(args)?;
    if args.scheduler == Scheduler::Slurm {
        return if args.status {
            slurm_report(args, &plan)
        } else if args.slurm_task {
            slurm_task(args, &plan, &rungs)
        } else {
            slurm_submit(args, &plan, &engine, &levers)
        };
    }
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
    let sealed = sealed::local(&root).bundles;
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
    let mut runner = child_runner(args, root, remote.as_ref(), None)?;
    let out = execute(
        &plan,
        &rungs,
        &done,
        &mut runner,
        Some(&mut budget),
        |e, what| {
            eprintln!(
                "campaign: position {} ({}, rung {}, {}={}{}): {what}",
                e.position,
                e.round_label(),
                e.rung,
                e.lever,
                e.arm,
                e.with_label()
            );
        },
    )?;
    Ok(report_outcome(&out))
}

/// The Slurm flags only with `--scheduler slurm`; there, no `--lease-id` among
/// the run flags (the Slurm job is each run's lease) and no `--budget-s` (the
/// task's `--time` bounds it).
fn check_scheduler_flags(args: &CampaignArgs) -> anyhow::Result<()> {
    let slurm_only = [
        ("--partition", args.partition.is_some()),
        ("--gres", args.gres.is_some()),
        ("--time", args.time.is_some()),
        ("--max-parallel", args.max_parallel.is_some()),
        ("--status", args.status),
        ("--slurm-task", args.slurm_task),
        ("--expect-campaign", args.expect_campaign.is_some()),
    ];
    if args.scheduler == Scheduler::Local {
        if let Some((flag, _)) = slurm_only.iter().find(|(_, given)| *given) {
            return Err(UsageError(format!("{flag}: only with --scheduler slurm")).into());
        }
        return Ok(());
    }
    if args
        .run_flags
        .iter()
        .any(|f| f == "--lease-id" || f.starts_with("--lease-id="))
    {
        return Err(UsageError(
            "--scheduler slurm: each run's lease is its Slurm job and array index \
             (slurm:<job>_<round>); remove --lease-id from the run flags"
                .into(),
        )
        .into());
    }
    if args.budget_s.is_some() {
        return Err(UsageError(
            "--budget-s: with --scheduler slurm give each task a --time instead".into(),
        )
        .into());
    }
    if args.max_parallel == Some(0) {
        return Err(UsageError(
            "--max-parallel 0: expected at least 1 array task running at a time".into(),
        )
        .into());
    }
    Ok(())
}

/// The bucket a Slurm campaign publishes to (every node's runs must land in one
/// place a reviewer reads).
fn slurm_bucket(args: &CampaignArgs) -> anyhow::Result<crate::remote::S3Location> {
    crate::remote::location_of(args.store.as_deref())?.ok_or_else(|| {
        UsageError(
            "--scheduler slurm: --store (or HARNESS_STORE) must be an s3://bucket/prefix: \
             every node publishes its runs there, and the array resumes from it"
                .into(),
        )
        .into()
    })
}

/// A Slurm error as an exit code: a file not written is the harness's failure
/// (4), anything else (no sbatch, sbatch refusing, a bad option) an input one (2).
fn slurm_error(e: SlurmError) -> anyhow::Error {
    match e {
        SlurmError::Write { .. } => anyhow::Error::new(e),
        other => UsageError(other.to_string()).into(),
    }
}

/// The positions of `plan` sealed complete in the local store or the bucket, and
/// every bundle found there.
fn sealed_everywhere(
    plan: &Plan,
    loc: &crate::remote::S3Location,
) -> anyhow::Result<(BTreeSet<u32>, sealed::Found)> {
    let local = crate::remote::local_store()?;
    let found = sealed::everywhere(local.root(), Some(loc))?;
    Ok((plan::done_positions(plan, &found.bundles), found))
}

/// The command line of one array task: this campaign's arguments as given, with
/// the store, `--scheduler slurm --slurm-task` and the campaign id to expect.
fn task_command(
    args: &CampaignArgs,
    plan: &Plan,
    loc: &crate::remote::S3Location,
) -> anyhow::Result<Vec<String>> {
    let harness = std::env::current_exe().context("locating the harness binary")?;
    let engine = std::fs::canonicalize(&args.engine)
        .map_err(|e| UsageError(format!("--engine {}: {e}", args.engine.display())))?;
    let mut c = vec![
        harness.display().to_string(),
        "campaign".into(),
        "--rungs".into(),
        args.rungs.clone(),
        "--levers".into(),
        args.levers.clone(),
        "--repeat".into(),
        args.repeat.to_string(),
        "--seed".into(),
        args.seed.to_string(),
        "--order".into(),
        args.order.as_str().into(),
        "--engine".into(),
        engine.display().to_string(),
        "--weights-cache".into(),
        args.weights_cache.as_str().into(),
        "--spec".into(),
        args.spec.display().to_string(),
        "--store".into(),
        loc.to_string(),
    ];
    if let Some(w) = args.warmup {
        c.extend(["--warmup".into(), w.to_string()]);
    }
    c.extend([
        "--scheduler".into(),
        "slurm".into(),
        "--slurm-task".into(),
        "--expect-campaign".into(),
        plan.id.clone(),
    ]);
    if !args.run_flags.is_empty() {
        c.push("--".into());
        c.extend(args.run_flags.iter().cloned());
    }
    Ok(c)
}

/// Submit the rounds of `plan` not yet sealed as an sbatch array.
fn slurm_submit(
    args: &CampaignArgs,
    plan: &Plan,
    engine: &str,
    levers: &[Lever],
) -> anyhow::Result<u8> {
    let loc = slurm_bucket(args)?;
    let (done, sealed) = sealed_everywhere(plan, &loc)?;
    let budget = Budget::new(
        evidence::clock::monotonic_ns(),
        f64::INFINITY,
        WallHistory::from_bundles(plan, &sealed.bundles),
    );
    print_plan(args, plan, engine, levers, &done, &budget);
    let rounds = plan::rounds_todo(plan, &done);
    if rounds.is_empty() {
        println!(
            "slurm: nothing to submit: every position of campaign {} is sealed",
            plan.id
        );
        return Ok(exit::OK);
    }
    let options = SlurmOptions {
        partition: args.partition.clone(),
        gres: args.gres.clone(),
        time: args.time.clone(),
    };
    let local = crate::remote::local_store()?;
    let dir = local.root().join("campaigns").join(&plan.id);
    let workdir = std::env::current_dir().context("the current directory")?;
    let command = task_command(args, plan, &loc)?;
    let text = slurm_script::script(&ArrayJob {
        campaign: &plan.id,
        rounds: &rounds,
        options: &options,
        dir: &dir,
        workdir: &workdir,
        command: &command,
        max_parallel: args.max_parallel,
    })
    .map_err(slurm_error)?;
    if args.dry_run {
        println!(
            "slurm: would submit rounds {} as:",
            slurm_script::array_spec(&rounds)
        );
        print!("{text}");
        return Ok(exit::OK);
    }
    let write = |file: &Path, r: std::io::Result<()>| {
        r.map_err(|source| {
            slurm_error(SlurmError::Write {
                file: file.to_path_buf(),
                source,
            })
        })
    };
    write(&dir, std::fs::create_dir_all(&dir))?;
    let script = dir.join(slurm_script::SCRIPT_FILE);
    write(&script, std::fs::write(&script, &text))?;
    let job = slurm_cmd::sbatch(&script).map_err(slurm_error)?;
    let log = dir.join("submissions.txt");
    let line = format!(
        "job {job} rounds {}{} submitted at unix {} from {}\n",
        slurm_script::array_spec(&rounds),
        args.max_parallel
            .map_or(String::new(), |n| format!(" at most {n} at once")),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        crate::run::facts::hostname().unwrap_or_default()
    );
    write(&log, append(&log, &line))?;
    println!(
        "slurm: submitted job {job}: array {} (one task per round: {} round(s), {} position(s) \
         not sealed{}) of campaign {}, each run published to {loc}",
        slurm_script::array_spec(&rounds),
        rounds.len(),
        plan.entries.len() - done.len(),
        args.max_parallel
            .map_or(String::new(), |n| format!("; at most {n} task(s) at once")),
        plan.id
    );
    println!(
        "slurm: script {}, each task's output {}/slurm-{job}_<round>.out on its node",
        script.display(),
        dir.display()
    );
    println!("slurm: status: the same command with --status; rerun it to resubmit what is missing");
    Ok(exit::OK)
}

/// Append `line` to `file` (created if missing).
fn append(file: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?
        .write_all(line.as_bytes())
}

/// One array task: its round of `plan`, every position already sealed skipped,
/// each run under the task's lease, published to the bucket.
fn slurm_task(args: &CampaignArgs, plan: &Plan, rungs: &[RungRef]) -> anyhow::Result<u8> {
    let task = ArrayTask::from_env().map_err(slurm_error)?;
    if let Some(want) = &args.expect_campaign {
        if want != &plan.id {
            return Err(UsageError(format!(
                "array task {}: this node computes campaign {} but the array was submitted \
                 for {want}: the engine binary, rung files or spec differ here from the \
                 submitting machine's",
                task.lease_id(),
                plan.id
            ))
            .into());
        }
    }
    if task.round > plan.repeat {
        return Err(UsageError(format!(
            "array task {}: round {} is past the campaign's {} round(s)",
            task.lease_id(),
            task.round,
            plan.repeat
        ))
        .into());
    }
    let loc = slurm_bucket(args)?;
    let (done, _) = sealed_everywhere(plan, &loc)?;
    let mine = plan::round_only(plan, task.round);
    let already = mine
        .entries
        .iter()
        .filter(|e| done.contains(&e.position))
        .count();
    eprintln!(
        "campaign: slurm task {} on {} (node {}): round {} of campaign {}: {} position(s), {already} already sealed",
        task.lease_id(),
        crate::run::facts::hostname().unwrap_or_default(),
        task.node.as_deref().unwrap_or("?"),
        task.round,
        plan.id,
        mine.entries.len()
    );
    let root = crate::remote::local_store()?.root().to_path_buf();
    let mut runner = child_runner(args, root, Some(&loc), Some(task.lease_id()))?;
    let out = execute(&mine, rungs, &done, &mut runner, None, |e, what| {
        eprintln!(
            "campaign: position {} ({}, rung {}, {}={}{}): {what}",
            e.position,
            e.round_label(),
            e.rung,
            e.lever,
            e.arm,
            e.with_label()
        );
    })?;
    Ok(report_outcome(&out))
}

/// `--status`: each round's tasks and sealed positions.
fn slurm_report(args: &CampaignArgs, plan: &Plan) -> anyhow::Result<u8> {
    let loc = slurm_bucket(args)?;
    let (done, found) = sealed_everywhere(plan, &loc)?;
    let name = slurm_script::job_name(&plan.id);
    let mut tasks = slurm_cmd::squeue(&name).map_err(slurm_error)?;
    let note = match slurm_cmd::sacct(&name).map_err(slurm_error)? {
        Accounting::Rows(rows) => {
            tasks.extend(rows);
            None
        }
        Accounting::Disabled(said) => Some(format!(
            "{said} (no accounting on this cluster: finished tasks are shown while \
             slurmctld remembers them, MinJobAge, and after that from the leases their \
             runs recorded; the bucket says what they sealed)"
        )),
    };
    let rounds = slurm_status::rounds(plan, &done, &found.unfinished, &tasks, &found.leases);
    print!("{}", slurm_status::render(plan, &rounds, note.as_deref()));
    Ok(if rounds.iter().all(|r| r.sealed == r.positions) {
        exit::OK
    } else {
        exit::NEGATIVE
    })
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

    /// A `with` setting the engine cannot apply is an error naming the spec, the
    /// lever and the setting; one it can passes. Mutation that turns this red:
    /// the `with` loop dropped (both bad settings pass).
    #[test]
    fn a_with_the_engine_lacks_is_an_error_naming_it() {
        let registry = BTreeMap::from([
            ("attention".to_string(), vec!["mma".into(), "cudnn".into()]),
            ("precision".to_string(), vec!["bf16".into(), "fp8".into()]),
        ]);
        let spec = Path::new("specs/levers.toml");
        let ok = crate::campaign::plan::tests::attention_with("fp8");
        let (have, missing) = reconcile(spec, vec![&ok], &registry).unwrap();
        assert_eq!((have.len(), missing.len()), (1, 0));
        let mut no_arm = ok.clone();
        no_arm.with.insert("precision".into(), "fp4".into());
        let e = reconcile(spec, vec![&no_arm], &registry)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "specs/levers.toml: lever 'attention' with.precision = 'fp4': the engine's arms are bf16|fp8"
        );
        let mut no_lever = ok.clone();
        no_lever.with.insert("fp8-accum".into(), "fast".into());
        let e = reconcile(spec, vec![&no_lever], &registry)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "lever 'attention' with.fp8-accum = 'fast': the engine has no lever 'fp8-accum'"
            ),
            "{e}"
        );
        // The harness's own lever is known without the engine.
        let mut observer = ok.clone();
        observer.with.insert("observer".into(), "off".into());
        assert!(reconcile(spec, vec![&observer], &registry).is_ok());
    }
}
