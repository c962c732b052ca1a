//! `harness ls`: one line per bundle in the store.

use clap::Args;
use evidence::fragments::{Levers, Run, Rung};
use serde::Serialize;

use crate::bundle::error::{FileError, ManifestError};
use crate::exit;
use crate::remote::reader::Remote;
use crate::store_arg::{classify, StoreArg};
use crate::summary::BundleSummary;

/// List the bundles: id, rung, levers, exit, wall, date, host (oldest first).
/// An exit marked `*` is an incomplete bundle, `!` one that ran under contention
/// (rank excludes both).
#[derive(Debug, Args)]
pub struct LsArgs {
    /// The store to list (`--store`, `$HARNESS_STORE`).
    #[command(flatten)]
    pub store: StoreArg,
    /// Print one JSON array on stdout: one object per bundle, oldest first, with
    /// id, rung, levers, exit, complete, contended, run_wall_s, wall_s, date_unix_s, host
    /// (fields of `LsRow`). Exit 0; 2 or 3 when the store cannot be opened.
    #[arg(long)]
    pub json: bool,
}

/// One bundle in `harness ls --json`. Fields are stable; new ones may be added.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LsRow {
    /// The bundle id (64 hex).
    pub id: String,
    /// `rung.name`, null when not recorded.
    pub rung: Option<String>,
    /// `levers` {lever: arm}; empty for the defaults.
    pub levers: std::collections::BTreeMap<String, String>,
    /// `exit.reason`, null when not recorded.
    pub exit: Option<String>,
    /// The manifest's `complete`.
    pub complete: bool,
    /// `contention.flagged`: other work on the host before or during the run.
    pub contended: bool,
    /// The harness's run wall in seconds, null when not recorded.
    pub run_wall_s: Option<f64>,
    /// The engine's wall in seconds (first to last marker), null without markers.
    pub wall_s: Option<f64>,
    /// When the run started, seconds since the Unix epoch (else the bundle's mtime).
    pub date_unix_s: Option<i64>,
    /// `run.hostname`, null when not recorded.
    pub host: Option<String>,
}

impl LsRow {
    /// The row for one bundle summary.
    pub fn of(s: &BundleSummary) -> LsRow {
        let m = &s.manifest;
        LsRow {
            id: s.id.clone(),
            rung: s.fragment::<Rung>().and_then(|r| r.name),
            levers: s.fragment::<Levers>().map(|l| l.0).unwrap_or_default(),
            exit: m.exit().and_then(|e| e.reason),
            complete: m.complete,
            contended: s.contended(),
            run_wall_s: m.phases.run_wall_s,
            wall_s: m.phases.wall_s,
            date_unix_s: s.date_unix_s,
            host: s.fragment::<Run>().and_then(|r| r.hostname),
        }
    }
}

/// The summary of bundle `id` of a bucket from its manifest alone, checked
/// against the id; `url` (the bundle's `s3://` URL) names it in errors.
fn remote_summary(remote: &Remote, url: &str, id: &str) -> anyhow::Result<BundleSummary> {
    let file = std::path::Path::new(url).join(evidence::bundle_files::MANIFEST);
    let bytes = remote
        .manifest_bytes(id)
        .map_err(|e| FileError {
            file: file.clone(),
            source: std::io::Error::other(e.to_string()),
        })
        .map_err(ManifestError::from)?;
    let manifest = crate::bundle::manifest::parse_typed(bytes, &file)?;
    Ok(BundleSummary::of(id.to_string(), manifest, || None))
}

/// Exit 0; a bundle whose manifest cannot be read is reported on stderr.
///
/// With `--store s3://...` the committed bundles of the bucket are listed from
/// their manifests alone (each checked against its id); an upload that did not
/// finish is not a bundle and is not listed.
pub fn run(args: LsArgs) -> anyhow::Result<u8> {
    let mut rows = Vec::new();
    let shown_root;
    if let Some(loc) = crate::remote::location_of(args.store.store.as_deref())? {
        let remote = Remote::new(crate::remote::open(&loc)?);
        let listing = remote.bucket().list_bundles()?;
        for id in crate::remote::fetch::committed(&listing) {
            match remote_summary(&remote, &loc.bundle_url(&id), &id) {
                Ok(s) => rows.push(s),
                Err(e) => eprintln!(
                    "harness: {id}: unreadable manifest: {}",
                    crate::redact::urls(&crate::escape::terminal(&format!("{e:#}")))
                ),
            }
        }
        shown_root = loc.to_string();
    } else {
        let store = args.store.open()?;
        for id in store.bundle_ids().map_err(classify)? {
            match BundleSummary::load(&store.bundles_dir().join(&id)) {
                Ok(s) => rows.push(s),
                Err(e) => eprintln!(
                    "harness: {id}: unreadable manifest: {}",
                    crate::redact::urls(&crate::escape::terminal(&format!("{e:#}")))
                ),
            }
        }
        shown_root = store.root().display().to_string();
    }
    rows.sort_by(|a, b| a.date_unix_s.cmp(&b.date_unix_s).then(a.id.cmp(&b.id)));
    if args.json {
        let out: Vec<LsRow> = rows.iter().map(LsRow::of).collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(exit::OK);
    }
    println!(
        "{:<12}  {:<8} {:<28} {:<16} {:>9}  {:<16}  host",
        "id", "rung", "levers", "exit", "wall", "date (UTC)"
    );
    // Every field from a manifest with its control characters shown, so that
    // no value can act on the terminal or add a row.
    let t = crate::escape::terminal;
    for s in &rows {
        println!(
            "{:<12}  {:<8} {:<28} {:<16} {:>9}  {:<16}  {}",
            t(crate::short_id::short(&s.id)),
            t(&s.rung()),
            t(&s.levers()),
            t(&format!(
                "{}{}",
                s.exit(),
                if s.contended() { "!" } else { "" }
            )),
            s.wall(),
            s.date(),
            t(&s.host())
        );
    }
    if rows.is_empty() {
        println!("(no bundles in {shown_root})");
    }
    Ok(exit::OK)
}
