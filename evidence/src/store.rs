//! The store: where journals are staged and bundles are kept, on durable storage.
//!
//! Layout under the store root:
//!
//! ```text
//! bundles/<id>/     sealed bundles, named by id, never overwritten
//! staging/<run>/    one per run: `lock` (flock held while the run lives),
//!                   `journal`, `frames/` (engine --out), `scratch/`
//! bin/<sha256>      engine binaries copied out of the worktree (H5)
//! cache/            synthesized weights
//! renders/<id>.y4m  each bundle's video, moved out of staging at seal
//! ```
//!
//! The durability gate ([`check_durable`]) refuses a store or staging directory
//! under `/tmp`, `/var/tmp` or `/mnt`, or on a tmpfs or ramfs file system: those do
//! not survive the reboot an out-of-memory causes on a unified-memory box (H1, H2).
//! It judges every directory the store writes, resolved through links, not only
//! the root: a `bundles` or `staging` linked into /tmp or onto another file system
//! is refused before anything is created.
//!
//! The gate is not only judged at the start: [`Store::resolve`] opens the
//! `bundles` directory it judged and keeps the descriptor, and
//! [`Store::publish`] renames a sealed bundle into that descriptor
//! (`renameat2`), after judging the store again and checking that `bundles`
//! is still the directory it opened. A `bundles` swapped for a link during a
//! run can therefore neither receive the bundle nor be reported as its home:
//! the publish is refused ([`StoreError::Volatile`]) and the bundle stays in
//! staging.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_at, IoAt, StoreError};

/// Environment variable naming the store directory.
pub const STORE_ENV: &str = "HARNESS_STORE";

/// The environment variable naming the local store that stages runs (and keeps
/// verified copies) when the store is an S3 bucket.
pub const LOCAL_STORE_ENV: &str = "HARNESS_LOCAL_STORE";
/// Directories refused by path, with why.
pub const VOLATILE_PREFIXES: &[(&str, &str)] = &[
    ("/tmp", "under /tmp, which does not survive a reboot"),
    (
        "/var/tmp",
        "under /var/tmp, which is not kept across a reboot on the fleet",
    ),
    (
        "/mnt",
        "under /mnt, where scratch and removable mounts live",
    ),
];
/// statfs `f_type` of tmpfs.
pub const TMPFS_MAGIC: u64 = 0x0102_1994;
/// statfs `f_type` of ramfs.
pub const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// The name of the lock file inside a staging directory.
pub const LOCK_FILE: &str = "lock";
/// The name of the journal inside a staging directory.
pub const JOURNAL_FILE: &str = "journal";
/// Written into a staging directory once its bundle is published (holds the id).
pub const SEALED_FILE: &str = "sealed_id";

/// fsync a directory, so that entries created or renamed in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<(), IoAt> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io_at(dir, "fsync directory"))
}

/// Make `path` absolute and drop `.` and `..` lexically.
fn absolute_lexical(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// The nearest ancestor of `abs` (itself included) that exists, resolved through
/// symlinks, with the components that do not exist yet appended.
fn resolve_existing(abs: &Path) -> (PathBuf, PathBuf) {
    let mut existing = abs.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut full = real.clone();
            for n in rest.iter().rev() {
                full.push(n);
            }
            return (real, full);
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(n), Some(p)) => {
                rest.push(n);
                existing = p.to_path_buf();
            }
            _ => return (PathBuf::from("/"), abs.to_path_buf()),
        }
    }
}

fn statfs_type(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `st` is plain data that statfs fills; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    Some((st.f_type as u64) & 0xffff_ffff)
}

/// Refuse `path` unless evidence written there survives a reboot.
///
/// Rules, each named in the error: the path (as given and resolved through
/// symlinks) must not lie under `/tmp`, `/var/tmp` or `/mnt`, and the file system
/// holding it (or its nearest existing ancestor) must not be tmpfs or ramfs.
pub fn check_durable(path: &Path) -> Result<(), StoreError> {
    let lexical = absolute_lexical(path);
    let (existing, resolved) = resolve_existing(&lexical);
    for candidate in [&lexical, &resolved] {
        for (prefix, why) in VOLATILE_PREFIXES {
            if candidate.starts_with(prefix) {
                let rule = if candidate == &lexical {
                    format!("path rule: {why}")
                } else {
                    format!("path rule: resolves to {}, {why}", resolved.display())
                };
                return Err(StoreError::Volatile {
                    path: path.to_path_buf(),
                    rule,
                });
            }
        }
    }
    match statfs_type(&existing) {
        Some(TMPFS_MAGIC) => Err(StoreError::Volatile {
            path: path.to_path_buf(),
            rule: format!(
                "file-system rule: {} is on tmpfs (statfs f_type 0x01021994), which is memory and is lost at reboot",
                existing.display()
            ),
        }),
        Some(RAMFS_MAGIC) => Err(StoreError::Volatile {
            path: path.to_path_buf(),
            rule: format!(
                "file-system rule: {} is on ramfs (statfs f_type 0x858458f6), which is memory and is lost at reboot",
                existing.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Every directory the store writes (`bundles`, `staging`, `bin`, `cache`,
/// `renders`) that exists under `root`, resolved through links, must pass
/// [`check_durable`] and lie on the root's own file system: a child linked
/// elsewhere would put the evidence where the gate never looked.
fn check_children(root: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(root_dev) = std::fs::metadata(root).map(|m| m.dev()) else {
        return Ok(()); // not created yet: nothing below it exists either
    };
    for sub in STORE_DIRS {
        let child = root.join(sub);
        let Ok(link) = std::fs::symlink_metadata(&child) else {
            continue;
        };
        if !link.file_type().is_symlink() && !link.is_dir() {
            return Err(StoreError::Volatile {
                path: child,
                rule: "layout rule: expected a directory of the store".into(),
            });
        }
        check_durable(&child)?;
        let resolved = child.canonicalize().unwrap_or_else(|_| child.clone());
        match std::fs::metadata(&child) {
            Ok(m) if m.dev() != root_dev => {
                return Err(StoreError::Volatile {
                    path: child.clone(),
                    rule: format!(
                        "file-system rule: resolves to {}, on another file system than the \
                         store root {}; point --store at a store on that disk instead of \
                         linking part of one there",
                        resolved.display(),
                        root.display()
                    ),
                })
            }
            Ok(_) => {}
            // A dangling link: creating the layout would follow it somewhere
            // unjudged.
            Err(_) => {
                return Err(StoreError::Volatile {
                    path: child.clone(),
                    rule: format!(
                        "layout rule: a link to {}, which does not exist",
                        std::fs::read_link(&child)
                            .map(|t| t.display().to_string())
                            .unwrap_or_else(|_| "an unreadable target".into())
                    ),
                })
            }
        }
    }
    Ok(())
}

/// The directories a store holds under its root.
pub const STORE_DIRS: [&str; 5] = ["bundles", "staging", "bin", "cache", "renders"];

/// The store location from, in order: `explicit`, `$HARNESS_STORE`,
/// `$XDG_DATA_HOME/harness/store`, `$HOME/.local/share/harness/store`.
/// A URL (`s3://bucket/prefix`) is refused with [`StoreError::NotLocal`]: it
/// must never become a relative directory named `s3:`.
pub fn default_location(explicit: Option<&Path>) -> Result<PathBuf, StoreError> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let chosen = explicit
        .map(Path::to_path_buf)
        .or_else(|| nonempty(STORE_ENV).map(PathBuf::from));
    if let Some(p) = chosen {
        let text = p.to_string_lossy();
        if text.contains("://") {
            return Err(StoreError::NotLocal {
                location: text.into_owned(),
            });
        }
        return Ok(p);
    }
    local_default_location()
}

/// The local store a machine keeps when `--store` names no directory:
/// `$HARNESS_LOCAL_STORE`, else `$XDG_DATA_HOME/harness/store`, else
/// `$HOME/.local/share/harness/store` (never `$HARNESS_STORE`, which may name a
/// bucket). Where runs stage and journal, and verified copies of remote bundles
/// are kept, when the store is an S3 bucket.
pub fn local_default_location() -> Result<PathBuf, StoreError> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = nonempty(LOCAL_STORE_ENV) {
        let text = p.to_string_lossy().into_owned();
        if text.contains("://") {
            return Err(StoreError::NotLocal { location: text });
        }
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = nonempty("XDG_DATA_HOME") {
        return Ok(PathBuf::from(p).join("harness").join("store"));
    }
    if let Some(h) = nonempty("HOME") {
        return Ok(PathBuf::from(h).join(".local/share/harness/store"));
    }
    Err(StoreError::NoLocation)
}

/// Whether `name` is a bundle id: 64 lowercase hex digits.
pub fn is_bundle_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A store on durable storage, with its layout created.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    volatile_override: bool,
    /// `bundles/` as the durability gate judged it, opened then: publishing
    /// renames into this descriptor, never through the path again.
    bundles: Option<std::sync::Arc<BundlesDir>>,
}

/// The `bundles` directory opened when the store was gated, with its identity.
#[derive(Debug)]
struct BundlesDir {
    fd: std::os::fd::OwnedFd,
    dev: u64,
    ino: u64,
}

impl BundlesDir {
    /// Open `dir` (a directory; links were judged by the gate) and note its
    /// device and inode.
    fn open(dir: &Path) -> Result<BundlesDir, StoreError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(io_at(dir, "open the bundles directory"))?;
        let md = f
            .metadata()
            .map_err(io_at(dir, "stat the bundles directory"))?;
        Ok(BundlesDir {
            dev: md.dev(),
            ino: md.ino(),
            fd: std::os::fd::OwnedFd::from(f),
        })
    }
}

impl Store {
    /// --store DIR > $HARNESS_STORE > $XDG_DATA_HOME/harness/store >
    /// ~/.local/share/harness/store. Applies the durability gate (before creating
    /// anything) and creates the layout.
    pub fn resolve(explicit: Option<&Path>) -> Result<Store, StoreError> {
        let root = default_location(explicit)?;
        check_durable(&root)?;
        // The children that already exist are judged before anything is
        // created: a `bundles` link into /tmp must not gain a directory there.
        check_children(&root)?;
        let mut store = Self::create_layout(&root, false)?;
        check_durable(&store.root)?;
        check_children(&store.root)?;
        store.bundles = Some(std::sync::Arc::new(BundlesDir::open(&store.bundles_dir())?));
        Ok(store)
    }

    /// The durability gate judged again, and `bundles/` checked to still be
    /// the directory opened when the store was gated (same device and inode).
    fn regate(&self, pinned: &BundlesDir) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        check_durable(&self.root)?;
        check_children(&self.root)?;
        let dir = self.bundles_dir();
        let now = std::fs::metadata(&dir).map(|m| (m.dev(), m.ino()));
        if now.as_ref().ok() != Some(&(pinned.dev, pinned.ino)) {
            return Err(StoreError::Volatile {
                path: dir.clone(),
                rule: format!(
                    "layout rule: no longer the directory the gate judged when the store \
                     was opened (replaced while the run lasted{})",
                    match std::fs::canonicalize(&dir) {
                        Ok(p) => format!("; it now resolves to {}", p.display()),
                        Err(e) => format!(": {e}"),
                    }
                ),
            });
        }
        Ok(())
    }

    /// Open a store WITHOUT the durability gate. For demonstrations on machines
    /// whose only writable space is volatile; every bundle sealed into it records
    /// `store.volatile_override = true` in its manifest.
    pub fn resolve_volatile_override(explicit: Option<&Path>) -> Result<Store, StoreError> {
        let root = default_location(explicit)?;
        Self::create_layout(&root, true)
    }

    fn create_layout(root: &Path, volatile_override: bool) -> Result<Store, StoreError> {
        for sub in STORE_DIRS {
            let d = root.join(sub);
            std::fs::create_dir_all(&d).map_err(io_at(&d, "create store directory"))?;
        }
        let root = root
            .canonicalize()
            .map_err(io_at(root, "resolve store directory"))?;
        Ok(Store {
            root,
            volatile_override,
            bundles: None,
        })
    }

    /// The store's root directory (absolute, symlinks resolved).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this store was opened past the durability gate.
    pub fn volatile_override(&self) -> bool {
        self.volatile_override
    }

    /// `store/bundles`.
    pub fn bundles_dir(&self) -> PathBuf {
        self.root.join("bundles")
    }

    /// `store/staging`.
    pub fn staging_root(&self) -> PathBuf {
        self.root.join("staging")
    }

    /// `store/bin`: engine binaries copied out, named by their sha256 (H5).
    pub fn bin_dir(&self) -> PathBuf {
        self.root.join("bin")
    }

    /// `store/cache`: synthesized weights.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// `store/renders`: each bundle's `video.y4m` as `<id>.y4m`.
    pub fn renders_dir(&self) -> PathBuf {
        self.root.join("renders")
    }

    /// Create `staging/<unique>/` with its lock held (until the [`Staging`] drops),
    /// its `frames/` and `scratch/`. The directory appears under its final name
    /// only once locked, so `recover` never mistakes a starting run for a dead one.
    pub fn open_staging(&self) -> Result<Staging, StoreError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = self.staging_root();
        loop {
            let name = format!(
                "{}-{}-{}",
                crate::clock::monotonic_ns(),
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let tmp = base.join(format!(".new-{name}"));
            let dir = base.join(&name);
            if dir.exists() {
                continue;
            }
            std::fs::create_dir(&tmp).map_err(io_at(&tmp, "create staging directory"))?;
            let lock = match try_lock_staging(&tmp)? {
                Some(l) => l,
                None => continue,
            };
            for sub in ["frames", "scratch"] {
                let d = tmp.join(sub);
                std::fs::create_dir(&d).map_err(io_at(&d, "create staging directory"))?;
            }
            std::fs::rename(&tmp, &dir).map_err(io_at(&dir, "name staging directory"))?;
            fsync_dir(&base)?;
            if !self.volatile_override {
                check_durable(&dir)?;
            }
            return Ok(Staging { dir, _lock: lock });
        }
    }

    /// Every bundle id in the store, sorted.
    pub fn bundle_ids(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.bundles_dir();
        let mut ids = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io_at(&dir, "list bundles"))? {
            let e = e.map_err(io_at(&dir, "list bundles"))?;
            if let Some(n) = e.file_name().to_str() {
                if is_bundle_id(n) && e.path().is_dir() {
                    ids.push(n.to_string());
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The bundle directory for a full id, a unique id prefix, or a path to a
    /// bundle directory (one holding `manifest.json`).
    pub fn find(&self, id_prefix_or_path: &str) -> Result<PathBuf, StoreError> {
        let q = id_prefix_or_path;
        let as_path = Path::new(q);
        if (q.contains('/') || as_path.join("manifest.json").is_file()) && as_path.is_dir() {
            return as_path
                .canonicalize()
                .map_err(|e| IoAt::new(as_path, "resolve bundle directory", e).into());
        }
        let unknown = || StoreError::UnknownBundle {
            store: self.root.clone(),
            query: q.to_string(),
        };
        let ql = q.to_ascii_lowercase();
        if ql.is_empty() || !ql.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(unknown());
        }
        let hits: Vec<String> = self
            .bundle_ids()?
            .into_iter()
            .filter(|id| id.starts_with(&ql))
            .collect();
        match hits.len() {
            0 => Err(unknown()),
            1 => Ok(self.bundles_dir().join(&hits[0])),
            n => Err(StoreError::AmbiguousBundle {
                store: self.root.clone(),
                query: q.to_string(),
                count: n,
                examples: hits
                    .iter()
                    .take(3)
                    .map(|h| &h[..16])
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Staging directories (not the ones still being created), sorted by name.
    pub fn staging_dirs(&self) -> Result<Vec<PathBuf>, StoreError> {
        let dir = self.staging_root();
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io_at(&dir, "list staging"))? {
            let e = e.map_err(io_at(&dir, "list staging"))?;
            let name = e.file_name();
            if !name.as_bytes().starts_with(b".") && e.path().is_dir() {
                out.push(e.path());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Atomically rename `from` to `bundles/<id>`, never replacing an existing
    /// bundle. Returns `false` when a bundle with that id already exists (then
    /// `from` is left in place for the caller to remove). `from` must be a
    /// directory on the store's file system holding a verified bundle (sealing and
    /// `harness unpack` verify before they publish); the bundles directory is
    /// fsynced after the rename.
    ///
    /// A store opened through [`Store::resolve`] is judged again first and
    /// the rename goes into the `bundles` directory opened then (see the
    /// module docs): a refusal is [`StoreError::Volatile`], `from` left in place.
    pub fn publish(&self, from: &Path, id: &str) -> Result<bool, StoreError> {
        let to = self.bundles_dir().join(id);
        let Some(pinned) = &self.bundles else {
            let published = rename_noreplace(from, &to)?;
            fsync_dir(&self.bundles_dir())?;
            return Ok(published);
        };
        self.regate(pinned)?;
        let published = match renameat2_at(from, &pinned.fd, id, libc::RENAME_NOREPLACE)? {
            Ok(()) => true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOTEMPTY)) => {
                false
            }
            // A file system without RENAME_NOREPLACE: through the path, which
            // was judged a moment ago.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                rename_noreplace(from, &to)?
            }
            Err(e) => return Err(IoAt::new(&to, "rename into place", e).into()),
        };
        // SAFETY: fsync on a descriptor this store owns.
        if unsafe { libc::fsync(std::os::fd::AsRawFd::as_raw_fd(&pinned.fd)) } != 0 {
            return Err(
                IoAt::new(self.bundles_dir(), "fsync", std::io::Error::last_os_error()).into(),
            );
        }
        Ok(published)
    }

    /// Replace `bundles/<id>` with the directory `from` in one step (renameat2
    /// `RENAME_EXCHANGE`): afterwards `bundles/<id>` holds what `from` held, and the
    /// former bundle is at the returned path (`from` itself), for the caller to
    /// remove. Only for a bundle that fails verification, replaced by a verified copy
    /// of the same id (`harness unpack`); `publish` never replaces. On a file system
    /// without `RENAME_EXCHANGE` the old directory is renamed aside to `from` + `.old`
    /// first (a moment without `bundles/<id>`), then `from` into place.
    pub fn replace(&self, from: &Path, id: &str) -> Result<PathBuf, StoreError> {
        let to = self.bundles_dir().join(id);
        let old = match renameat2(from, &to, libc::RENAME_EXCHANGE, "exchange")? {
            Ok(()) => from.to_path_buf(),
            Err(err) => {
                if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
                    return Err(IoAt::new(&to, "exchange with the replacement", err).into());
                }
                let mut aside = from.as_os_str().to_owned();
                aside.push(".old");
                let aside = PathBuf::from(aside);
                std::fs::rename(&to, &aside).map_err(io_at(&to, "rename aside"))?;
                if let Err(e) = std::fs::rename(from, &to) {
                    let _ = std::fs::rename(&aside, &to);
                    return Err(IoAt::new(&to, "rename the replacement into place", e).into());
                }
                aside
            }
        };
        fsync_dir(&self.bundles_dir())?;
        Ok(old)
    }
}

/// `renameat2(from, to, flags)` relative to the working directory: `Ok(Ok(()))`
/// done, `Ok(Err(errno))` refused by the call, `Err` for a path that is no C
/// string (`what` names the operation).
fn renameat2(
    from: &Path,
    to: &Path,
    flags: libc::c_uint,
    what: &'static str,
) -> Result<std::io::Result<()>, IoAt> {
    let cf = CString::new(from.as_os_str().as_bytes())
        .map_err(|e| IoAt::new(from, what, std::io::Error::other(e)))?;
    let ct = CString::new(to.as_os_str().as_bytes())
        .map_err(|e| IoAt::new(to, what, std::io::Error::other(e)))?;
    // SAFETY: both are valid C strings; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cf.as_ptr(),
            libc::AT_FDCWD,
            ct.as_ptr(),
            flags,
        )
    };
    Ok(if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    })
}

/// `renameat2(from, dir/name, flags)`, `from` relative to the working
/// directory and the target relative to the open directory `dir`.
fn renameat2_at(
    from: &Path,
    dir: &std::os::fd::OwnedFd,
    name: &str,
    flags: libc::c_uint,
) -> Result<std::io::Result<()>, IoAt> {
    let cf = CString::new(from.as_os_str().as_bytes())
        .map_err(|e| IoAt::new(from, "rename", std::io::Error::other(e)))?;
    let cn = CString::new(name)
        .map_err(|e| IoAt::new(Path::new(name), "rename", std::io::Error::other(e)))?;
    // SAFETY: both are valid C strings and `dir` an open descriptor; renameat2
    // only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cf.as_ptr(),
            std::os::fd::AsRawFd::as_raw_fd(dir),
            cn.as_ptr(),
            flags,
        )
    };
    Ok(if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    })
}

/// Rename `from` to `to` unless `to` exists: `Ok(true)` renamed, `Ok(false)` exists.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> Result<bool, IoAt> {
    let Err(err) = renameat2(from, to, libc::RENAME_NOREPLACE, "rename")? else {
        return Ok(true);
    };
    match err.raw_os_error() {
        Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => Ok(false),
        // File systems without RENAME_NOREPLACE: check, then a plain rename, which
        // cannot replace a non-empty directory (every bundle holds a manifest).
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            if to.exists() {
                return Ok(false);
            }
            match std::fs::rename(from, to) {
                Ok(()) => Ok(true),
                Err(e) if to.exists() => {
                    let _ = e;
                    Ok(false)
                }
                Err(e) => Err(IoAt::new(to, "rename into place", e)),
            }
        }
        _ => Err(IoAt::new(to, "rename into place", err)),
    }
}

/// Take the exclusive lock of staging directory `dir` without waiting.
/// `Ok(None)` when another process (a live run, a concurrent recover) holds it.
pub fn try_lock_staging(dir: &Path) -> Result<Option<File>, StoreError> {
    let p = dir.join(LOCK_FILE);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(io_at(&p, "open staging lock"))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(f));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(IoAt::new(&p, "lock staging directory", err).into())
    }
}

/// One run's staging directory; its lock is held while this value lives.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    _lock: File,
}

impl Staging {
    /// `store/staging/<run>/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The run's journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }
    /// Where the engine writes its frames and video (`engine --out`).
    pub fn frames_dir(&self) -> PathBuf {
        self.dir.join("frames")
    }
    /// Scratch space for the run (not sealed).
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.join("scratch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_dir(name: &str) -> PathBuf {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/evidence-unit")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn volatile_paths_are_refused_naming_path_and_rule() {
        for (p, needle) in [
            ("/tmp/store", "/tmp"),
            ("/var/tmp/x/y", "/var/tmp"),
            ("/mnt/data", "/mnt"),
            ("/work/../tmp/s", "/tmp"),
            ("/tmp", "/tmp"),
        ] {
            let e = check_durable(Path::new(p)).unwrap_err().to_string();
            assert!(
                e.contains(p) && e.contains(needle) && e.contains("rule"),
                "{e}"
            );
        }
        // Not a prefix match on text: /tmpfoo is not /tmp.
        assert!(check_durable(Path::new("/tmpfoo/x")).is_ok());
        assert!(check_durable(&test_dir("durable")).is_ok());
    }

    #[test]
    fn a_symlink_into_tmp_is_refused() {
        let d = test_dir("symlink");
        let link = d.join("to-tmp");
        std::os::unix::fs::symlink("/tmp", &link).unwrap();
        let e = check_durable(&link.join("store")).unwrap_err().to_string();
        assert!(e.contains("resolves to /tmp"), "{e}");
    }

    #[test]
    fn a_child_linked_into_tmp_or_off_the_file_system_is_refused_before_anything_is_made() {
        for (sub, target) in [
            (
                "bundles",
                PathBuf::from("/tmp").join(format!("harness-link-{}", std::process::id())),
            ),
            (
                "staging",
                PathBuf::from("/dev/shm").join(format!("harness-link-{}", std::process::id())),
            ),
        ] {
            if !target.parent().is_some_and(Path::exists) {
                continue;
            }
            let root = test_dir(&format!("child-link-{sub}"));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            std::fs::create_dir_all(&target).unwrap();
            std::os::unix::fs::symlink(&target, root.join(sub)).unwrap();
            let e = Store::resolve(Some(&root)).unwrap_err().to_string();
            assert!(e.contains(sub), "{e}");
            // Nothing was created: not the layout, not under the link.
            let made: Vec<_> = std::fs::read_dir(&root)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(made, vec![std::ffi::OsString::from(sub)], "{e}");
            assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
            let _ = std::fs::remove_dir_all(&target);
        }
    }

    #[test]
    fn a_dangling_child_link_is_refused() {
        let root = test_dir("child-dangling");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("bin")).unwrap();
        let e = Store::resolve(Some(&root)).unwrap_err().to_string();
        assert!(e.contains("bin") && e.contains("does not exist"), "{e}");
        assert!(!root.join("nowhere").exists());
    }

    #[test]
    fn tmpfs_is_refused_by_statfs() {
        // /dev/shm is tmpfs on Linux; skip the assertion only if it is absent.
        let shm = Path::new("/dev/shm");
        if statfs_type(shm) == Some(TMPFS_MAGIC) {
            let e = check_durable(&shm.join("store")).unwrap_err().to_string();
            assert!(e.contains("tmpfs"), "{e}");
        } else {
            panic!("/dev/shm is not tmpfs here; the statfs rule cannot be exercised");
        }
    }

    #[test]
    fn layout_staging_lock_and_find() {
        let d = test_dir("layout");
        let s = Store::resolve(Some(&d.join("store"))).unwrap();
        for sub in ["bundles", "staging", "bin", "cache", "renders"] {
            assert!(s.root().join(sub).is_dir());
        }
        let st = s.open_staging().unwrap();
        assert!(st.dir().starts_with(s.staging_root()));
        assert!(st.frames_dir().is_dir() && st.scratch_dir().is_dir());
        // The lock is held while `st` lives, free after.
        assert!(try_lock_staging(st.dir()).unwrap().is_none());
        assert_eq!(s.staging_dirs().unwrap(), vec![st.dir().to_path_buf()]);
        let dir = st.dir().to_path_buf();
        drop(st);
        assert!(try_lock_staging(&dir).unwrap().is_some());

        let a = format!("abcd{}", "0".repeat(60));
        let b = format!("abce{}", "1".repeat(60));
        for id in [&a, &b] {
            std::fs::create_dir(s.bundles_dir().join(id)).unwrap();
        }
        std::fs::create_dir(s.bundles_dir().join("not-an-id")).unwrap();
        assert_eq!(s.bundle_ids().unwrap(), vec![a.clone(), b.clone()]);
        assert_eq!(s.find("abcd").unwrap(), s.bundles_dir().join(&a));
        assert_eq!(s.find("ABCE").unwrap(), s.bundles_dir().join(&b));
        assert!(matches!(
            s.find("abc"),
            Err(StoreError::AmbiguousBundle { count: 2, .. })
        ));
        assert!(matches!(
            s.find("ffff"),
            Err(StoreError::UnknownBundle { .. })
        ));
        let p = s.bundles_dir().join(&a);
        std::fs::write(p.join("manifest.json"), "{}").unwrap();
        assert_eq!(s.find(p.to_str().unwrap()).unwrap(), p);
    }

    #[test]
    fn publish_never_replaces() {
        let d = test_dir("publish");
        let s = Store::resolve(Some(&d.join("store"))).unwrap();
        let id = "e".repeat(64);
        let one = d.join("one");
        let two = d.join("two");
        for (dir, text) in [(&one, "first"), (&two, "second")] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("manifest.json"), text).unwrap();
        }
        assert!(s.publish(&one, &id).unwrap());
        assert!(!s.publish(&two, &id).unwrap());
        let kept = std::fs::read_to_string(s.bundles_dir().join(&id).join("manifest.json"));
        assert_eq!(kept.unwrap(), "first");
        assert!(two.exists());
    }

    #[test]
    fn replace_swaps_a_bundle_for_a_new_directory() {
        let d = test_dir("replace");
        let s = Store::resolve(Some(&d.join("store"))).unwrap();
        let id = "c".repeat(64);
        let old = s.staging_root().join(".old-copy");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("manifest.json"), "old").unwrap();
        assert!(s.publish(&old, &id).unwrap());
        let new = s.staging_root().join(".new-copy");
        std::fs::create_dir(&new).unwrap();
        std::fs::write(new.join("manifest.json"), "new").unwrap();
        let aside = s.replace(&new, &id).unwrap();
        let in_place = s.bundles_dir().join(&id).join("manifest.json");
        assert_eq!(std::fs::read_to_string(in_place).unwrap(), "new");
        assert_eq!(
            std::fs::read_to_string(aside.join("manifest.json")).unwrap(),
            "old"
        );
    }

    #[test]
    fn location_precedence() {
        assert_eq!(
            default_location(Some(Path::new("/x/y"))).unwrap(),
            PathBuf::from("/x/y")
        );
    }
}
