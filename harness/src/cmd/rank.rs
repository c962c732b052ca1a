//! `harness rank`: its arguments, and the command that loads every bundle of a
//! store, ranks the levers of the spec and prints, writes or checks the report and
//! its forest plot.

use std::path::{Path, PathBuf};

use crate::bundle::files::store_bundle_dirs;
use crate::exit::{self, UsageError};
use crate::formats::forest::{self, file_beside};
use crate::formats::markdown::markdown_with_forest;
use crate::levers_spec::{LeverSpec, DEFAULT_SPEC};
use crate::store_arg::read_root;
use crate::verification::local::{load_verified, VerifiedLoad};

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
    /// Write the markdown report here (default: print it), and its forest plot
    /// beside it (`levers.md` -> `levers-forest.svg`); `-` prints the table alone.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the ranking as JSON on stdout (levers with effects, intervals and
    /// verdicts, fit, used and excluded bundles). Exit 0; 2 for a bad spec or store.
    #[arg(long)]
    pub json: bool,
    /// Regenerate the report and its forest plot as `--out FILE` would and compare
    /// both with FILE and the plot beside it byte for byte, writing nothing: exit 0
    /// when both are identical, 1 (naming each file that differs and its first
    /// differing line) when not.
    #[arg(long, value_name = "FILE", conflicts_with = "out")]
    pub check: Option<PathBuf>,
}

/// Run `harness rank`; returns the exit code.
pub fn run(args: &RankArgs) -> anyhow::Result<u8> {
    let spec = LeverSpec::load(&args.spec).map_err(|e| UsageError(e.to_string()))?;
    // `--out -` is the table on standard output (what no --out prints); the
    // forest plot is written only beside a file.
    let stdout_out = args.out.as_deref().is_some_and(crate::formats::is_stdout);
    let out_file = args.out.as_ref().filter(|_| !stdout_out);
    let (loaded, not_verified, store_shown) =
        match crate::remote::location_of(args.store.as_deref())? {
            Some(loc) => remote_load(&loc)?,
            None => {
                let root = read_root(args.store.as_deref())?;
                let dirs = store_bundle_dirs(&root)
                    .map_err(|e| UsageError(format!("store {}: {e}", root.display())))?;
                // Only bundles that verify are read; the others are excluded, naming the file.
                let VerifiedLoad {
                    loaded,
                    not_verified,
                    ..
                } = load_verified(&root, &dirs);
                (loaded, not_verified, root.display().to_string())
            }
        };
    let command = regenerate_command(
        "rank",
        &store_shown,
        &args.spec,
        out_file.or(args.check.as_ref()).map(PathBuf::as_path),
    );
    let ranking = crate::rank::rank(
        &spec,
        &loaded.bundles,
        &loaded.unreadable,
        &not_verified,
        &command,
    );
    // The forest plot goes beside the report file, and the report shows it.
    let forest_file = out_file.or(args.check.as_ref()).map(|p| file_beside(p));
    let forest_name = forest_file
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let md = markdown_with_forest(&ranking, forest_name.as_deref());
    let svg = forest::svg(&ranking);
    if let (Some(file), Some(forest_file)) = (&args.check, &forest_file) {
        let have = std::fs::read_to_string(file)
            .map_err(|e| UsageError(format!("--check {}: cannot read: {e}", file.display())))?;
        let mut same = true;
        // The `Regenerate:` line names the store it was made from (a directory
        // or a bucket holding the same bundles): compared apart from that.
        if let Some((line, committed, regenerated)) =
            first_difference(&store_free(&have), &store_free(&md))
        {
            println!(
                "{} differs from the regenerated report at line {line}:\n  file:        {committed}\n  regenerated: {regenerated}",
                file.display()
            );
            same = false;
        }
        match std::fs::read_to_string(forest_file) {
            Ok(have) => {
                if let Some((line, committed, regenerated)) = first_difference(&have, &svg) {
                    println!(
                        "{} differs from the regenerated forest plot at line {line}:\n  file:        {committed}\n  regenerated: {regenerated}",
                        forest_file.display()
                    );
                    same = false;
                }
            }
            Err(e) => {
                println!(
                    "{}: cannot read the forest plot ({e}); `{command}` writes it",
                    forest_file.display()
                );
                same = false;
            }
        }
        if !same {
            return Ok(exit::NEGATIVE);
        }
        println!(
            "{} and {} reproduce from {} bundle(s) in {}",
            file.display(),
            forest_file.display(),
            ranking.bundles_seen,
            store_shown
        );
        return Ok(exit::OK);
    }
    match (out_file, &forest_file) {
        (Some(out), Some(forest_file)) => {
            // Through a temporary file and a rename (the directory made as needed):
            // a full disk never leaves a truncated table under the committed name.
            crate::formats::write_file(out, md.as_bytes())?;
            crate::formats::write_file(forest_file, svg.as_bytes())?;
            eprintln!(
                "harness rank: {} bundle(s), {} used, {} excluded; wrote {} and {}",
                ranking.bundles_seen,
                ranking.used.len(),
                ranking.excluded.len(),
                out.display(),
                forest_file.display()
            );
        }
        _ if !args.json => print!("{md}"),
        _ => {}
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

/// The command that regenerates a ranking: `harness VERB --store STORE`, with
/// `--spec` when it is not the default and `--out` when there is one (what the
/// report's `Regenerate:` line says).
pub fn regenerate_command(verb: &str, store: &str, spec: &Path, out: Option<&Path>) -> String {
    let mut command = format!("harness {verb} --store {store}");
    if spec != Path::new(DEFAULT_SPEC) {
        command.push_str(&format!(" --spec {}", spec.display()));
    }
    if let Some(out) = out {
        command.push_str(&format!(" --out {}", out.display()));
    }
    command
}

/// `text` with the store of its `Regenerate:` line replaced by `STORE`: the
/// same bundles ranked from a directory or from a bucket give the same report.
pub fn store_free(text: &str) -> String {
    const LEAD: &str = "Regenerate: `harness rank --store ";
    text.split_inclusive('\n')
        .map(|l| match l.strip_prefix(LEAD) {
            Some(rest) => {
                let end = rest.find([' ', '`']).unwrap_or(rest.len());
                format!("{LEAD}STORE{}", &rest[end..])
            }
            None => l.to_string(),
        })
        .collect()
}

/// The bundles of the bucket at `loc` that `rank` may read, loaded: each one
/// fetched into this machine's local store and verified there in this process
/// (`remote::fetch::fetch_all`, as `report` does), then scanned from disk.
/// How many verified goes to stderr.
fn remote_load(
    loc: &crate::remote::S3Location,
) -> anyhow::Result<(
    crate::bundle::scan::Loaded,
    Vec<crate::bundle::facts::Exclusion>,
    String,
)> {
    // Every bundle fetched into this machine's local store and verified
    // there in this process (a local copy that fails is fetched again), as
    // `report` does: what rank computes from are bytes it hashed, and `rank`
    // and `report` of one bucket read the same copies.
    let bucket = crate::remote::open(loc)?;
    let local = crate::remote::local_store()?;
    let (dirs, excluded) = crate::remote::fetch::fetch_all(&bucket, &local)?;
    eprintln!(
        "harness rank: {loc}: {} committed bundle(s), {} verified in the local store {}",
        dirs.len() + excluded.len(),
        dirs.len(),
        local.root().display()
    );
    let loaded = crate::bundle::scan::load_dirs(&dirs);
    Ok((loaded, excluded, loc.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_regenerate_line_is_compared_without_its_store() {
        let a = "# t\n\nRegenerate: `harness rank --store reports/evidence --out reports/levers.md`\nx\n";
        let b = "# t\n\nRegenerate: `harness rank --store s3://bkt/p --out reports/levers.md`\nx\n";
        assert_eq!(store_free(a), store_free(b));
        assert!(store_free(a).contains("--store STORE --out reports/levers.md`"));
        // Anything else still differs.
        let c = b.replace("--out reports/levers.md", "--out other.md");
        assert_ne!(store_free(a), store_free(&c));
        assert_ne!(store_free(a), store_free(&a.replace("x\n", "y\n")));
        assert_eq!(
            store_free("Regenerate: `harness rank --store d`\n"),
            "Regenerate: `harness rank --store STORE`\n"
        );
    }

    #[test]
    fn the_first_difference_names_the_line_and_both_versions() {
        assert_eq!(first_difference("a\nb\n", "a\nb\n"), None);
        assert_eq!(
            first_difference("a\nb\n", "a\nc\n"),
            Some((2, "\"b\\n\"".into(), "\"c\\n\"".into()))
        );
        assert_eq!(
            first_difference("a\n", "a\nb\n"),
            Some((2, "<end of file>".into(), "\"b\\n\"".into()))
        );
    }
}
