//! Bundles are read only once they verify: every command that reads a bundle
//! (`rank`, `diff`, `show`, `plot`, `export`, `campaign`'s resume) first runs
//! [`evidence::verify`] on it (the directory name is the sha256 of the
//! canonical `manifest.json`, every listed file has its size, sha256, schema
//! and row count, nothing unlisted is there), and excludes or refuses a bundle
//! that fails, naming the file at fault.
//!
//! `rank`, `report`, a campaign's resume and `sync` verify every bundle in
//! full in this process ([`VerifyCache::in_process`], what [`load_verified`]
//! uses): no stamp vouches for evidence (`specs/bundle.md`, "What is
//! trusted"). For the interactive readers (`show`, `diff`, `plot`, `export`)
//! the ids of the bundles that verified are
//! remembered per store ([`VerifyCache::for_store`], a [`StampCache`]) together with each file's size,
//! modification and change times and inode: a bundle whose files are exactly
//! as they were is not read again; any change (a write, a `touch`, a copy, a
//! swap of two files) re-verifies it. The change time cannot be set by a user,
//! so a file edited and given back its old modification time still counts as
//! changed. The cache lives outside the store (`$HARNESS_VERIFY_CACHE`, else
//! `$XDG_CACHE_HOME/ltx-harness` or `~/.cache/ltx-harness`), where a writer of
//! the store cannot vouch for its own bundles; `HARNESS_VERIFY_CACHE=off`
//! verifies everything every time. A cache that cannot be read or written is
//! ignored: it only saves time.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bundle::facts::Exclusion;
use crate::cache_dir::{cache_base, hex16};
use crate::verification::cache::StampCache;

/// One file of a bundle as the file system describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    name: String,
    bytes: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    inode: u64,
}

/// Verified bundle ids of one store, remembered between commands: each id with
/// the stamps of its files when it verified ([`StampCache`]).
#[derive(Debug)]
pub struct VerifyCache {
    cache: StampCache<Vec<Stamp>>,
    /// Whether a bundle whose stamps match a remembered entry is taken as
    /// verified: only for the interactive readers, never for evidence.
    trust_stamps: bool,
}

/// Why a bundle is not read: the directory and what failed, naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dir}: does not verify: {why}")]
pub struct NotVerified {
    /// The bundle directory.
    pub dir: PathBuf,
    /// The failures (the first few), each naming its file.
    pub why: String,
}

/// At most this many failures are named per bundle (the rest are counted).
pub const NAMED_FAILURES: usize = 3;

/// The first [`NAMED_FAILURES`] of `errors` (each naming its file) joined with
/// `; `, and how many more there are: what a refusal says of a bundle.
pub fn named_failures<E: ToString>(errors: &[E]) -> String {
    let mut why: Vec<String> = errors
        .iter()
        .take(NAMED_FAILURES)
        .map(ToString::to_string)
        .collect();
    if errors.len() > NAMED_FAILURES {
        why.push(format!("and {} more", errors.len() - NAMED_FAILURES));
    }
    why.join("; ")
}

fn stamps(dir: &Path) -> std::io::Result<Vec<Stamp>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let md = std::fs::symlink_metadata(e.path())?;
        out.push(Stamp {
            name: e.file_name().to_string_lossy().into_owned(),
            bytes: md.len(),
            mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
            ctime_ns: md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128,
            inode: md.ino(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Where the cache of the store at `root` lives, or `None` when caching is off
/// or no cache directory can be named.
fn cache_path(root: &Path) -> Option<PathBuf> {
    let base = cache_base()?;
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let key = hex16(canonical.to_string_lossy().as_bytes());
    Some(base.join(format!("verified-{key}.json")))
}

impl VerifyCache {
    /// The cache of the store at `root` (empty when none was written yet, or
    /// when it cannot be read).
    pub fn for_store(root: &Path) -> VerifyCache {
        VerifyCache {
            cache: StampCache::open(cache_path(root), root.display().to_string(), "verified"),
            trust_stamps: true,
        }
    }

    /// No cache: every bundle is verified in full, every byte hashed in this
    /// process, and nothing is remembered. What `rank`, `report`, a
    /// campaign's resume and `sync` use: the ranking never rests on a stamp
    /// (a file edited through a writable shared mapping keeps its stamps; a
    /// cache file can be planted), see `specs/bundle.md`.
    pub fn in_process() -> VerifyCache {
        VerifyCache {
            cache: StampCache::open(None, String::new(), "verified"),
            trust_stamps: false,
        }
    }

    /// Verify the bundle at `dir` unless its files are exactly as they were
    /// when it last verified.
    pub fn check(&mut self, dir: &Path) -> Result<(), NotVerified> {
        let not = |why: String| NotVerified {
            dir: dir.to_path_buf(),
            why,
        };
        let id = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if !evidence::store::is_bundle_id(&id) {
            return Err(not(format!(
                "the directory name {id:?} is not a bundle id (64 lowercase hex digits: the \
                 sha256 of its manifest.json)"
            )));
        }
        let before = stamps(dir).map_err(|e| not(format!("cannot list the bundle: {e}")))?;
        if self.trust_stamps && self.cache.trusted(&id, &before) {
            return Ok(());
        }
        let report = evidence::verify::verify_dir(dir);
        if !report.ok() {
            self.cache.forget(&id);
            return Err(not(named_failures(&report.errors)));
        }
        // Remember what was read only if nothing changed while it was read.
        if self.trust_stamps && stamps(dir).ok().as_ref() == Some(&before) {
            self.cache.remember(id, before);
        }
        Ok(())
    }

    /// Keep the verified ids for the next command ([`StampCache::save`]).
    pub fn save(&self) {
        self.cache.save();
    }
}

/// Split `dirs` into those that verify and exclusions for those that do not
/// (by directory name, the reason naming the file), saving the cache after.
pub fn partition(dirs: &[PathBuf], cache: &mut VerifyCache) -> (Vec<PathBuf>, Vec<Exclusion>) {
    let mut ok = Vec::new();
    let mut excluded = Vec::new();
    for d in dirs {
        match cache.check(d) {
            Ok(()) => ok.push(d.clone()),
            Err(e) => excluded.push(Exclusion {
                id: d
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| d.display().to_string()),
                reason: format!("does not verify: {}", e.why),
            }),
        }
    }
    cache.save();
    (ok, excluded)
}

/// The bundles of a store read as evidence: those of `dirs` that verify,
/// loaded ([`crate::bundle::scan::load_dirs`]), and exclusions for the rest.
#[derive(Debug, Default)]
pub struct VerifiedLoad {
    /// The directories that verified.
    pub dirs: Vec<PathBuf>,
    /// What they hold (and which of them could not be read after all).
    pub loaded: crate::bundle::scan::Loaded,
    /// The bundles that do not verify, each naming the file at fault.
    pub not_verified: Vec<Exclusion>,
}

/// Verify `dirs` (bundles of the store at `_root`) in full, every byte hashed
/// in this process with no cache consulted, and load the ones that pass: what
/// `rank` and `report` read.
pub fn load_verified(_root: &Path, dirs: &[PathBuf]) -> VerifiedLoad {
    let (dirs, not_verified) = partition(dirs, &mut VerifyCache::in_process());
    let loaded = crate::bundle::scan::load_dirs(&dirs);
    VerifiedLoad {
        dirs,
        loaded,
        not_verified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_change_with_content_and_with_a_swap_of_equal_sizes() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/test-scratch/verified-stamps");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a"), b"1234").unwrap();
        std::fs::write(d.join("b"), b"5678").unwrap();
        let s0 = stamps(&d).unwrap();
        assert_eq!(s0.len(), 2);
        assert_eq!(s0, stamps(&d).unwrap());
        // Swap two files of one size: names, sizes and even mtimes can match, the
        // inodes (and change times) cannot.
        std::fs::rename(d.join("a"), d.join("t")).unwrap();
        std::fs::rename(d.join("b"), d.join("a")).unwrap();
        std::fs::rename(d.join("t"), d.join("b")).unwrap();
        assert_ne!(s0, stamps(&d).unwrap());
    }
}
