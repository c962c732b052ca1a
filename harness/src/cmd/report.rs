//! `harness report`: its arguments, and the command that ranks a store and writes
//! the report directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bundle::facts::Exclusion;
use crate::bundle::files::store_bundle_dirs;
use crate::bundle::manifest::read_facts;
use crate::exit::{self, UsageError};
use crate::formats::forest;
use crate::formats::html as page;
use crate::formats::markdown::markdown_with_forest;
use crate::levers_spec::{LeverSpec, DEFAULT_SPEC};
use crate::report::{artifacts, outdir};
use crate::store_arg::read_root;
use crate::verification::local::{load_verified, VerifiedLoad};

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
    // A bucket's bundles are fetched whole into this machine's local store
    // (each verified; kept for the next report) and reported from there.
    let (root, dirs, not_fetched, store_label) =
        match crate::remote::location_of(args.store.as_deref())? {
            Some(loc) => fetch_all(&loc)?,
            None => {
                let root = read_root(args.store.as_deref())?;
                let dirs = local_dirs(&root)?;
                let label = root.display().to_string();
                (root, dirs, Vec::new(), label)
            }
        };
    if dirs.is_empty() && not_fetched.is_empty() {
        return Err(UsageError(format!(
            "store {store_label}: holds no bundles (no bundles/*/manifest.json): nothing to report"
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
        mut not_verified,
    } = load_verified(&root, &dirs);
    not_verified.extend(not_fetched);
    not_verified.sort();
    let command =
        crate::cmd::rank::regenerate_command("report", &store_label, &args.spec, Some(&args.out));
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

/// The bundle directories of the store directory `root` (a usage error when it
/// is missing).
fn local_dirs(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !root.is_dir() {
        return Err(UsageError(format!("store {}: no such directory", root.display())).into());
    }
    if !root.join("bundles").is_dir() {
        return Ok(Vec::new());
    }
    store_bundle_dirs(root).map_err(|e| UsageError(format!("store {}: {e}", root.display())).into())
}

/// Every committed bundle of the bucket at `loc` fetched into the local store:
/// (the local store's root, the fetched directories, the bundles that could not
/// be fetched because they do not verify, the bucket's URL as the label).
fn fetch_all(
    loc: &crate::remote::S3Location,
) -> anyhow::Result<(PathBuf, Vec<PathBuf>, Vec<Exclusion>, String)> {
    let bucket = crate::remote::open(loc)?;
    let local = crate::remote::local_store()?;
    let (dirs, failed) = crate::remote::fetch::fetch_all(&bucket, &local)?;
    Ok((local.root().to_path_buf(), dirs, failed, loc.to_string()))
}
