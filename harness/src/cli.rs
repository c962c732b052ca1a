//! The command-line layer of `harness rank`, `harness diff` and `harness campaign`:
//! argument structs and the functions `main` dispatches to. Each returns the exit
//! code (see [`crate::exit`]); errors carry the file and field they concern.

use anyhow::Context;
use std::path::{Path, PathBuf};

use crate::bundle::{files, manifest, scan};
use crate::exit::{self, UsageError};
use crate::levers_spec::LeverSpec;

/// Where the lever spec lives by default (relative to the working directory).
pub const DEFAULT_SPEC: &str = "specs/levers.toml";

/// `harness rank`: re-derive the lever ranking from the bundles in a store.
#[derive(Debug, clap::Args)]
pub struct RankArgs {
    /// The store to read (default: $HARNESS_STORE, then
    /// $XDG_DATA_HOME/harness/store, then ~/.local/share/harness/store).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The lever spec.
    #[arg(long, default_value = DEFAULT_SPEC)]
    pub spec: PathBuf,
    /// Write the markdown report here (default: print it).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the ranking as JSON on stdout (levers with effects, intervals and
    /// verdicts, fit, used and excluded bundles). Exit 0; 2 for a bad spec or store.
    #[arg(long)]
    pub json: bool,
    /// Regenerate the report as `--out FILE` would and compare it with FILE byte
    /// for byte, writing nothing: exit 0 when identical, 1 (naming the first
    /// differing line) when not.
    #[arg(long, value_name = "FILE", conflicts_with = "out")]
    pub check: Option<PathBuf>,
}

/// `harness diff A B`: two bundles side by side.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// Bundle A: an id (or unique prefix) in the store, or a bundle directory.
    pub a: String,
    /// Bundle B: an id (or unique prefix) in the store, or a bundle directory.
    pub b: String,
    /// The store to look ids up in (same default as `rank`).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Print the comparison as one JSON object on stdout: {a, b, fields, phases,
    /// summaries}. Exit 0; 2 for an unknown or ambiguous id.
    #[arg(long)]
    pub json: bool,
}

/// The store root for reading: `--store`, then `$HARNESS_STORE`, then
/// `$XDG_DATA_HOME/harness/store`, then `~/.local/share/harness/store` (the order of
/// `evidence`'s store resolution; reading needs no durability gate).
pub fn read_store_root(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = env("HARNESS_STORE") {
        return Ok(p);
    }
    if let Some(p) = env("XDG_DATA_HOME") {
        return Ok(p.join("harness/store"));
    }
    if let Some(h) = env("HOME") {
        return Ok(h.join(".local/share/harness/store"));
    }
    Err(UsageError("no store: pass --store DIR or set HARNESS_STORE".into()).into())
}

/// Run `harness rank`.
pub fn rank(args: &RankArgs) -> anyhow::Result<u8> {
    let spec = LeverSpec::load(&args.spec).map_err(|e| UsageError(e.to_string()))?;
    let root = read_store_root(args.store.as_deref())?;
    let dirs = files::store_bundle_dirs(&root)
        .map_err(|e| UsageError(format!("store {}: {e}", root.display())))?;
    let loaded = scan::load_dirs(&dirs);
    let mut command = format!("harness rank --store {}", root.display());
    if args.spec != Path::new(DEFAULT_SPEC) {
        command.push_str(&format!(" --spec {}", args.spec.display()));
    }
    if let Some(out) = args.out.as_ref().or(args.check.as_ref()) {
        command.push_str(&format!(" --out {}", out.display()));
    }
    let ranking = crate::rank::rank(&spec, &loaded.bundles, &loaded.unreadable, &command);
    let md = crate::rank::report::markdown(&ranking);
    if let Some(file) = &args.check {
        let have = std::fs::read_to_string(file)
            .map_err(|e| UsageError(format!("--check {}: cannot read: {e}", file.display())))?;
        return Ok(match first_difference(&have, &md) {
            None => {
                println!(
                    "{} reproduces from {} bundle(s) in {}",
                    file.display(),
                    ranking.bundles_seen,
                    root.display()
                );
                exit::OK
            }
            Some((line, committed, regenerated)) => {
                println!(
                    "{} differs from the regenerated report at line {line}:\n  file:        {committed}\n  regenerated: {regenerated}",
                    file.display()
                );
                exit::NEGATIVE
            }
        });
    }
    match &args.out {
        Some(out) => {
            // Through a temporary file and a rename (the directory made as needed):
            // a full disk never leaves a truncated table under the committed name.
            crate::formats::write_file(out, md.as_bytes())?;
            eprintln!(
                "harness rank: {} bundle(s), {} used, {} excluded; wrote {}",
                ranking.bundles_seen,
                ranking.used.len(),
                ranking.excluded.len(),
                out.display()
            );
        }
        None if !args.json => print!("{md}"),
        None => {}
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ranking)?);
    }
    Ok(exit::OK)
}

/// The first line (1-based) where `a` and `b` differ, with both versions of it
/// (`<end of file>` where one is shorter); None when they are byte-identical.
pub fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    if a == b {
        return None;
    }
    let mut la = a.split_inclusive('\n');
    let mut lb = b.split_inclusive('\n');
    let mut n = 0;
    loop {
        n += 1;
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => {
                let show = |l: Option<&str>| {
                    l.map(|s| format!("{s:?}"))
                        .unwrap_or_else(|| "<end of file>".into())
                };
                return Some((n, show(x), show(y)));
            }
        }
    }
}

/// Find a bundle directory: an existing directory holding `manifest.json`, or a unique
/// id prefix under `<root>/bundles`.
pub fn find_bundle(root: Option<&Path>, what: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(what);
    if p.join("manifest.json").is_file() {
        return Ok(p.to_path_buf());
    }
    let root = read_store_root(root)?;
    let dirs = files::store_bundle_dirs(&root).map_err(|e| {
        UsageError(format!(
            "{what:?} is not a bundle directory, and the store cannot be listed: {e}"
        ))
    })?;
    let hits: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(what))
        })
        .collect();
    match hits.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(UsageError(format!(
            "no bundle {what:?} in {}",
            root.join("bundles").display()
        ))
        .into()),
        many => Err(UsageError(format!(
            "bundle prefix {what:?} is ambiguous in {}: {} matches; give more characters",
            root.display(),
            many.len()
        ))
        .into()),
    }
}

/// Run `harness diff`.
pub fn diff(args: &DiffArgs) -> anyhow::Result<u8> {
    let da = find_bundle(args.store.as_deref(), &args.a)?;
    let db = find_bundle(args.store.as_deref(), &args.b)?;
    let loaded = scan::load_dirs(&[da.clone(), db.clone()]);
    if let Some(u) = loaded.unreadable.first() {
        return Err(UsageError(format!("{}: {}", u.id, u.reason)).into());
    }
    let read = |d: &Path| -> anyhow::Result<serde_json::Value> {
        let f = d.join("manifest.json");
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| UsageError(format!("{}: not JSON: {e}", f.display())).into())
    };
    let (ma, mb) = (read(&da)?, read(&db)?);
    let facts = |d: &Path| manifest::read_facts(d).map(|b| b.id);
    let (ia, ib) = (facts(&da)?, facts(&db)?);
    let get = |id: &str| loaded.bundles.iter().find(|b| b.id == id);
    // The same bundle twice is a valid (empty) diff.
    let (Some(a), Some(b)) = (get(&ia), get(&ib)) else {
        return Err(UsageError(format!("{ia} or {ib} could not be loaded")).into());
    };
    let d = crate::diff::diff(a, &ma, b, &mb);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", crate::diff::markdown(&d));
    }
    Ok(exit::OK)
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
    pub order: crate::campaign::Order,
    /// The engine binary every run uses (hashed into the campaign id).
    #[arg(long, default_value = "target/debug/engine")]
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
    pub weights_cache: crate::weights_cache::Policy,
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

fn sha256_file(p: &Path) -> anyhow::Result<String> {
    evidence::weights_digest::sha256_file(p)
        .map_err(|e| UsageError(format!("{}: cannot read: {e}", p.display())).into())
}

/// The rung references of a `--rungs` argument.
pub fn campaign_rungs(arg: &str) -> anyhow::Result<Vec<crate::campaign::RungRef>> {
    use crate::levers_spec::DeviceKind;
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
        out.push(crate::campaign::RungRef {
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
pub fn engine_levers(
    engine: &Path,
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<String>>> {
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
pub fn parse_engine_levers(
    json: &[u8],
) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let map = v["levers"]
        .as_object()
        .ok_or("field 'levers': expected an object of levers")?;
    let mut out = std::collections::BTreeMap::new();
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

/// Split the selected levers into those the engine implements and the ids of those
/// it does not; an arm of an implemented lever that the engine lacks is an error
/// naming the spec, the lever and the engine's arms.
pub fn reconcile<'a>(
    spec: &Path,
    levers: Vec<&'a crate::levers_spec::Lever>,
    registry: &std::collections::BTreeMap<String, Vec<String>>,
) -> anyhow::Result<(Vec<&'a crate::levers_spec::Lever>, Vec<String>)> {
    let mut have = Vec::new();
    let mut missing = Vec::new();
    for l in levers {
        let Some(arms) = registry.get(&l.id) else {
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

/// Run `harness campaign`.
pub fn campaign(args: &CampaignArgs) -> anyhow::Result<u8> {
    let t0 = evidence::clock::monotonic_ns();
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
    let mut plan = crate::campaign::plan(
        &engine,
        &rungs,
        &levers,
        args.repeat,
        args.order,
        args.seed,
        args.weights_cache,
    );
    for l in &missing {
        for r in &rungs {
            plan.skipped.push(crate::campaign::Skip {
                lever: l.clone(),
                rung: r.name.clone(),
                why: format!(
                    "the engine ({}) has no lever '{l}' yet",
                    crate::short_id::short(&engine)
                ),
            });
        }
    }
    if let Some(b) = args.budget_s {
        if !(b.is_finite() && b > 0.0) {
            return Err(UsageError(format!(
                "--budget-s: expected a positive number of seconds, got {b}"
            ))
            .into());
        }
    }
    let root = read_store_root(args.store.as_deref())?;
    let sealed: Vec<_> = match files::store_bundle_dirs(&root) {
        Ok(dirs) => dirs
            .iter()
            .filter_map(|d| manifest::read_facts(d).ok())
            .collect(),
        Err(_) => Vec::new(),
    };
    let done = crate::campaign::done_positions(&plan, &sealed);
    // Always learned, for the progress lines; without --budget-s the deadline is
    // infinitely far and nothing is refused.
    let mut budget = crate::campaign_budget::Budget::new(
        t0,
        args.budget_s.unwrap_or(f64::INFINITY),
        crate::campaign_budget::WallHistory::from_bundles(&plan, &sealed),
    );
    println!(
        "campaign {} (engine {}, order {:?}, seed {}, weights cache {}): {} runs over {} round(s), {} already sealed",
        plan.id,
        crate::short_id::short(&engine),
        plan.order,
        plan.seed,
        args.weights_cache.as_str(),
        plan.entries.len(),
        plan.repeat,
        done.len()
    );
    for s in &plan.skipped {
        println!("  skip {} at rung {}: {}", s.lever, s.rung, s.why);
    }
    for w in crate::campaign::cache_warnings(&levers, args.weights_cache) {
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
            "  {:>4} round {:>2} rung {} {}={} {}{eta}",
            e.position,
            e.round,
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
    if args.dry_run {
        return Ok(exit::OK);
    }
    let harness = std::env::current_exe().context("locating the harness binary")?;
    let signals = crate::run::signals::Signals::install().context("installing signal handlers")?;
    let mut runner = crate::campaign_runner::ChildRunner {
        harness,
        engine: args.engine.clone(),
        store: root.clone(),
        extra: {
            let mut extra = Vec::new();
            if args.weights_cache != crate::weights_cache::Policy::AsIs {
                extra.push("--weights-cache".to_string());
                extra.push(args.weights_cache.as_str().to_string());
            }
            extra.extend(args.run_flags.iter().cloned());
            extra
        },
        signals: Some(std::sync::Arc::new(signals)),
    };
    let out = crate::campaign::execute(
        &plan,
        &rungs,
        &done,
        &mut runner,
        Some(&mut budget),
        |e, what| {
            eprintln!(
                "campaign: position {} (round {}, rung {}, {}={}): {what}",
                e.position, e.round, e.rung, e.lever, e.arm
            );
        },
    )?;
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
            Ok(if why.contains("refused by gate") {
                exit::REFUSED
            } else {
                exit::NEGATIVE
            })
        }
        None if out.incomplete.is_empty() => Ok(exit::OK),
        None => Ok(exit::NEGATIVE),
    }
}
