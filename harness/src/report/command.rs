//! `harness report`: its arguments, and the command that ranks a store and writes
//! the report directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bundle::files::store_bundle_dirs;
use crate::bundle::manifest::read_facts;
use crate::bundle::verified::{load_verified, VerifiedLoad};
use crate::exit::{self, UsageError};
use crate::levers_spec::{LeverSpec, DEFAULT_SPEC};
use crate::rank::forest;
use crate::rank::report::markdown_with_forest;
use crate::report::{artifacts, outdir, page};
use crate::store_arg::read_root;

/// `harness report`: the ranking, the forest plot, the phase-scaling fit, every
/// bundle used or excluded, and each pair's timelines and diff, as one static page.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The store to read (default: $HARNESS_STORE, then
    /// $XDG_DATA_HOME/harness/store, then ~/.local/share/harness/store).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The lever spec.
    #[arg(long, default_value = DEFAULT_SPEC)]
    pub spec: PathBuf,
    /// The directory to write (`index.html` and what it links). It must be new,
    /// empty, or made by an earlier `harness report` (which it then replaces).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Run `harness report`: exit 0 with the directory written; 2 for a bad spec, a
/// missing or empty store, or an `--out` that is not ours to overwrite.
pub fn run(args: &ReportArgs) -> anyhow::Result<u8> {
    let spec = LeverSpec::load(&args.spec).map_err(|e| UsageError(e.to_string()))?;
    let root = read_root(args.store.as_deref())?;
    if !root.is_dir() {
        return Err(UsageError(format!("store {}: no such directory", root.display())).into());
    }
    let dirs = if root.join("bundles").is_dir() {
        store_bundle_dirs(&root)
            .map_err(|e| UsageError(format!("store {}: {e}", root.display())))?
    } else {
        Vec::new()
    };
    if dirs.is_empty() {
        return Err(UsageError(format!(
            "store {}: holds no bundles (no bundles/*/manifest.json): nothing to report",
            root.display()
        ))
        .into());
    }
    // Refuse a foreign --out before any work.
    let staging = outdir::prepare(&args.out)?;
    // Only bundles that verify are read (bundle::verified); the rest are
    // listed as excluded, naming the file.
    let VerifiedLoad {
        dirs,
        loaded,
        not_verified,
    } = load_verified(&root, &dirs);
    let mut command = format!("harness report --store {}", root.display());
    if args.spec != Path::new(DEFAULT_SPEC) {
        command.push_str(&format!(" --spec {}", args.spec.display()));
    }
    command.push_str(&format!(" --out {}", args.out.display()));
    let ranking = crate::rank::rank(
        &spec,
        &loaded.bundles,
        &loaded.unreadable,
        &not_verified,
        &command,
    );

    // Bundle id -> directory, for every bundle whose manifest reads.
    let by_id: BTreeMap<String, PathBuf> = dirs
        .iter()
        .filter_map(|d| read_facts(d).ok().map(|b| (b.id, d.clone())))
        .collect();
    let art = artifacts::write(&staging.dir, &ranking, &by_id, &loaded.bundles)?;
    let put = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let file = staging.dir.join(name);
        std::fs::write(&file, bytes).with_context(|| format!("writing {}", file.display()))
    };
    put(
        "levers.md",
        markdown_with_forest(&ranking, Some("levers-forest.svg")).as_bytes(),
    )?;
    put("levers-forest.svg", forest::svg(&ranking).as_bytes())?;
    let store_label = root.display().to_string();
    put(
        "index.html",
        page::html(&ranking, &art, &store_label).as_bytes(),
    )?;
    let out = staging.commit()?;
    let timelines = art.timelines.values().filter(|t| t.is_ok()).count();
    let diffs = art.diffs.values().filter(|d| d.is_ok()).count();
    eprintln!(
        "harness report: {} bundle(s), {} used, {} excluded; {timelines} timeline(s), {diffs} diff(s)",
        ranking.bundles_seen,
        ranking.used.len(),
        ranking.excluded.len(),
    );
    println!("wrote {}", out.join("index.html").display());
    Ok(exit::OK)
}
