//! One bundle as one file (tar + zstd), what `harness pack` writes and `harness unpack`
//! checks and lands ([`crate::cmd::pack`], [`crate::cmd::unpack`]): a bundle (tar + zstd) that can
//! travel off a leased box, and back into a store only if every hash checks.
//!
//! A pack is a zstd-compressed tar holding `<id>/manifest.json` first, then every
//! other file of the bundle as `<id>/<name>` in name order, as regular files with
//! fixed metadata (mode 0444, owner 0, mtime 0), so the same bundle always packs
//! to the same bytes. Read it by hand with `zstd -dc F | tar tv`.
//!
//! Unpacking trusts nothing in the file. The tar headers are read raw (no GNU
//! long-name/long-link or PAX extension is interpreted): such a header, which a pack
//! never holds, is refused from its 512-byte header, before any of its body is read.
//! Every entry must be a regular file named `<id>/<name>` (one 64-hex id for the
//! whole pack, `<name>` one plain component), seen once, declaring at most
//! [`MAX_ENTRY_BYTES`] (at most [`MAX_TOTAL_BYTES`] and [`MAX_ENTRIES`] in all);
//! links, devices, `..`, absolute and nested names are refused before any data is
//! read. Names in messages are cut to [`MAX_NAME_SHOWN`] characters.
//!
//! Bounded resources: the zstd window is at most 2^[`PACK_WINDOW_LOG_MAX`] bytes,
//! entry bodies stream (64 KiB buffer) into files under `store/staging/.unpack-*`
//! and nothing of a pack is held whole in memory, so memory stays O(window +
//! buffers) whatever the pack declares, and the disk used is at most the declared
//! total ([`MAX_TOTAL_BYTES`]), removed on refusal. The written files are fsynced
//! and verified from disk by `evidence::verify` (itself bounded: the id is the
//! manifest's sha256, every file's sha256, size, schema and row count), and only
//! then renamed into `store/bundles/<id>` in one step. When `bundles/<id>` already
//! exists it is verified: intact, it stays and the new copy is dropped; failing
//! verification, it is swapped for the verified new copy in one rename and removed.
//! On any refusal nothing is left in the store.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use evidence::bundle_files::MANIFEST;
use evidence::error::StoreError;
use evidence::store::{is_bundle_id, Store};

use crate::exit;

/// The largest single file a pack may declare: 1 GiB.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// The most a pack may declare in all: 4 GiB (also the most disk an unpack uses).
pub const MAX_TOTAL_BYTES: u64 = 4 << 30;
/// The most entries a pack may hold (a bundle has fewer than ten files).
pub const MAX_ENTRIES: usize = 64;
/// The largest zstd window (log2 of bytes) a pack may ask for: 2^24 = 16 MiB.
/// `harness pack` (level 10) uses 2^22, `zstd -19` 2^23.
pub const PACK_WINDOW_LOG_MAX: u32 = 24;
/// The most characters of an entry name or link target a message shows.
pub const MAX_NAME_SHOWN: usize = 200;
/// The buffer entry bodies are copied to disk through: 64 KiB.
const COPY_BUF_BYTES: usize = 64 << 10;
/// zstd level of a pack (the tables inside are already compressed).
pub const PACK_ZSTD_LEVEL: i32 = 10;

/// Why a pack was refused. Every variant names the entry at fault; messages do
/// not repeat the pack's path, which the caller prints before them.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The file is not zstd-compressed tar, or is cut short.
    #[error("not a readable bundle pack (zstd-compressed tar): {why}")]
    Unreadable {
        /// The pack file.
        file: PathBuf,
        /// What the decoder said.
        why: String,
    },
    /// An entry name that is absolute, holds `..`, or is not `<id>/<file>`.
    #[error("entry {entry:?}: refused: the name leaves the bundle directory (expected `<id>/<file>`, no `..`, not absolute, not nested)")]
    Traversal {
        /// The name as stored.
        entry: String,
    },
    /// A symbolic or hard link.
    #[error("entry {entry:?}: refused: a {kind} (to {target:?}); a pack holds regular files only")]
    Link {
        /// The name as stored.
        entry: String,
        /// `symlink` or `hard link`.
        kind: &'static str,
        /// Where it points.
        target: String,
    },
    /// A device, fifo, sparse file or anything else that is not a plain file.
    #[error("entry {entry:?}: refused: entry type {kind} is not a regular file")]
    NotRegular {
        /// The name as stored.
        entry: String,
        /// The tar entry type, in words.
        kind: String,
    },
    /// The same name twice.
    #[error("entry {entry:?}: refused: it appears more than once in the pack")]
    Duplicate {
        /// The name as stored.
        entry: String,
    },
    /// An entry declaring more than [`MAX_ENTRY_BYTES`].
    #[error("entry {entry:?}: refused: declares {declared} bytes, more than the {limit}-byte limit for one file")]
    Oversize {
        /// The name as stored.
        entry: String,
        /// The size in its header.
        declared: u64,
        /// The limit.
        limit: u64,
    },
    /// The entries together declare more than [`MAX_TOTAL_BYTES`], or there are too many.
    #[error("refused: {why}")]
    TooLarge {
        /// Which limit, in words.
        why: String,
    },
    /// Entries under two different ids, or a first component that is not an id.
    #[error("entry {entry:?}: refused: {why}")]
    BadName {
        /// The name as stored.
        entry: String,
        /// What was expected.
        why: String,
    },
    /// An entry whose data ends before its declared size.
    #[error("entry {entry:?}: truncated: declares {declared} bytes, the pack holds {got}")]
    Short {
        /// The name as stored.
        entry: String,
        /// The declared size.
        declared: u64,
        /// What could be read.
        got: u64,
    },
    /// The files do not verify as the bundle they claim to be.
    #[error("bundle {id}: refused: {} verification failure(s): {}", errors.len(), errors.join("; "))]
    Verify {
        /// The id from the entry names.
        id: String,
        /// Every failure, naming its file.
        errors: Vec<String>,
    },
    /// The pack holds no files.
    #[error("refused: the pack holds no bundle files")]
    Empty {
        /// The pack file.
        file: PathBuf,
    },
    /// A GNU long-name or long-link header or a PAX extension header: refused from
    /// its 512-byte header, before its body (which could claim any size) is read.
    #[error("entry {entry:?}: refused: a {kind} header (declaring {declared} bytes); a bundle pack holds no tar extension headers (its names fit the ustar fields), so none is read")]
    Extension {
        /// The header's own name field (e.g. `././@LongLink`), cut to [`MAX_NAME_SHOWN`].
        entry: String,
        /// `GNU long-name`, `GNU long-link`, `PAX extended` or `PAX global`.
        kind: &'static str,
        /// The body size the header declares, in bytes.
        declared: u64,
    },
    /// The store could not be written (staging, publish, replace): not the pack's fault.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// An I/O error writing or reading back the staged files: not the pack's fault.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl UnpackError {
    /// The exit code: 1 when the files do not verify, 2 for a malformed or hostile
    /// pack, 3 for a store refused by its gate, 4 when the store could not be written.
    pub fn exit_code(&self) -> u8 {
        match self {
            UnpackError::Verify { .. } => exit::NEGATIVE,
            UnpackError::Store(StoreError::Volatile { .. }) => exit::REFUSED,
            UnpackError::Store(_) | UnpackError::Io { .. } => exit::INTERNAL,
            _ => exit::USAGE,
        }
    }
}

/// `name` as text for a message: lossy UTF-8, cut to [`MAX_NAME_SHOWN`] characters
/// (the cut marked with the full length in bytes).
pub fn shown(name: &[u8]) -> String {
    let s = String::from_utf8_lossy(name);
    if s.chars().count() <= MAX_NAME_SHOWN {
        return s.into_owned();
    }
    let cut: String = s.chars().take(MAX_NAME_SHOWN).collect();
    format!("{cut}... ({} bytes in all)", name.len())
}

/// The extension header kind of `t`, if it is one (see [`UnpackError::Extension`]).
fn extension_kind(t: tar::EntryType) -> Option<&'static str> {
    if t.is_gnu_longname() {
        Some("GNU long-name")
    } else if t.is_gnu_longlink() {
        Some("GNU long-link")
    } else if t.is_pax_local_extensions() {
        Some("PAX extended")
    } else if t.is_pax_global_extensions() {
        Some("PAX global")
    } else {
        None
    }
}

/// The tar bytes of the bundle in `dir` with id `id` (see the module docs).
pub fn tar_bytes(dir: &Path, id: &str) -> anyhow::Result<Vec<u8>> {
    let mut names: Vec<String> = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort_by(|a, b| (a != MANIFEST).cmp(&(b != MANIFEST)).then(a.cmp(b)));
    let mut b = tar::Builder::new(Vec::new());
    for name in names {
        let p = dir.join(&name);
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        let mut h = tar::Header::new_ustar();
        h.set_path(format!("{id}/{name}"))
            .with_context(|| format!("{}: name does not fit a tar header", p.display()))?;
        h.set_size(bytes.len() as u64);
        h.set_mode(0o444);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append(&h, bytes.as_slice())
            .with_context(|| format!("adding {name} to the pack"))?;
    }
    Ok(b.into_inner()?)
}

/// The pack bytes (zstd of [`tar_bytes`]) of the bundle in `dir`.
pub fn pack_bytes(dir: &Path, id: &str) -> anyhow::Result<Vec<u8>> {
    let tar = tar_bytes(dir, id)?;
    Ok(zstd::stream::encode_all(tar.as_slice(), PACK_ZSTD_LEVEL)?)
}

fn kind_of(t: tar::EntryType) -> String {
    match t {
        tar::EntryType::Regular => "regular file".into(),
        tar::EntryType::Directory => "directory".into(),
        tar::EntryType::Char => "character device".into(),
        tar::EntryType::Block => "block device".into(),
        tar::EntryType::Fifo => "fifo".into(),
        tar::EntryType::GNUSparse => "sparse file".into(),
        tar::EntryType::XGlobalHeader => "pax global header".into(),
        other => format!(
            "type '{}' (byte {})",
            other.as_byte() as char,
            other.as_byte()
        ),
    }
}

/// Check an entry name: `<id>/<file>` with `<file>` one plain component, or `<id>`
/// (a directory entry). Returns (id, file name or None for the directory).
fn split_name(entry: &str) -> Result<(String, Option<String>), UnpackError> {
    let traversal = || UnpackError::Traversal {
        entry: shown(entry.as_bytes()),
    };
    let p = Path::new(entry);
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str().ok_or_else(traversal)?.to_string()),
            Component::CurDir => {}
            _ => return Err(traversal()),
        }
    }
    match parts.as_slice() {
        [id] => Ok((id.clone(), None)),
        [id, name] => Ok((id.clone(), Some(name.clone()))),
        _ => Err(traversal()),
    }
}

/// Read and check a pack (see the module docs), writing its files into `dir`, an
/// existing empty directory, and verify them there. Returns the bundle id. On an
/// error `dir` may hold some of the files; the caller removes it.
pub fn read_pack_into(file: &Path, reader: impl Read, dir: &Path) -> Result<String, UnpackError> {
    let unreadable = |why: String| UnpackError::Unreadable {
        file: file.to_path_buf(),
        why,
    };
    let mut dec =
        zstd::stream::read::Decoder::new(reader).map_err(|e| unreadable(e.to_string()))?;
    dec.window_log_max(PACK_WINDOW_LOG_MAX)
        .map_err(|e| unreadable(e.to_string()))?;
    let mut archive = tar::Archive::new(dec);
    // Raw: the tar crate would otherwise read a long-name or PAX body whole, of
    // whatever size its header claims, before handing us the entry.
    let entries = archive
        .entries()
        .map_err(|e| unreadable(e.to_string()))?
        .raw(true);
    let mut id: Option<String> = None;
    let mut files: BTreeSet<String> = BTreeSet::new();
    let mut seen_dir = false;
    let (mut total, mut count) = (0u64, 0usize);
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    for e in entries {
        let mut e = e.map_err(|e| unreadable(e.to_string()))?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(UnpackError::TooLarge {
                why: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        // The full name (at most 256 bytes: raw headers are not extended) is checked;
        // messages show it cut.
        let raw_name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let entry = shown(raw_name.as_bytes());
        let ty = e.header().entry_type();
        if let Some(kind) = extension_kind(ty) {
            return Err(UnpackError::Extension {
                entry,
                kind,
                declared: e.header().entry_size().unwrap_or(u64::MAX),
            });
        }
        if ty.is_symlink() || ty.is_hard_link() {
            let target = e.link_name_bytes().map(|b| shown(&b)).unwrap_or_default();
            return Err(UnpackError::Link {
                entry,
                kind: if ty.is_symlink() {
                    "symlink"
                } else {
                    "hard link"
                },
                target,
            });
        }
        let (eid, name) = split_name(&raw_name)?;
        if !is_bundle_id(&eid) {
            return Err(UnpackError::BadName {
                entry,
                why: format!(
                    "the top directory {eid:?} is not a bundle id (64 lowercase hex digits)"
                ),
            });
        }
        match &id {
            Some(first) if first != &eid => {
                return Err(UnpackError::BadName {
                    entry,
                    why: format!(
                        "a pack holds one bundle, and this entry is under {eid}, not {first}"
                    ),
                })
            }
            Some(_) => {}
            None => id = Some(eid.clone()),
        }
        let Some(name) = name else {
            if !ty.is_dir() {
                return Err(UnpackError::NotRegular {
                    entry,
                    kind: kind_of(ty),
                });
            }
            if seen_dir {
                return Err(UnpackError::Duplicate { entry });
            }
            seen_dir = true;
            continue;
        };
        if ty != tar::EntryType::Regular && ty != tar::EntryType::Continuous {
            return Err(UnpackError::NotRegular {
                entry,
                kind: kind_of(ty),
            });
        }
        if files.contains(&name) {
            return Err(UnpackError::Duplicate { entry });
        }
        let declared = e.size();
        if declared > MAX_ENTRY_BYTES {
            return Err(UnpackError::Oversize {
                entry,
                declared,
                limit: MAX_ENTRY_BYTES,
            });
        }
        total += declared;
        if total > MAX_TOTAL_BYTES {
            return Err(UnpackError::TooLarge {
                why: format!("the entries declare more than {MAX_TOTAL_BYTES} bytes in all"),
            });
        }
        // Stream the body to disk through a fixed buffer: memory does not grow
        // with the declared size.
        let p = dir.join(&name);
        let io = |what: &'static str| {
            let p = p.clone();
            move |source| UnpackError::Io {
                path: p,
                what,
                source,
            }
        };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(io("create"))?;
        let mut got = 0u64;
        let mut body = (&mut e).take(declared);
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                // A read error is the pack's (cut short, corrupt zstd).
                Err(err) => return Err(unreadable(format!("entry {entry:?}: {err}"))),
            };
            out.write_all(&buf[..n]).map_err(io("write"))?;
            got += n as u64;
        }
        if got != declared {
            return Err(UnpackError::Short {
                entry,
                declared,
                got,
            });
        }
        out.sync_all().map_err(io("fsync"))?;
        files.insert(name);
    }
    let Some(id) = id.filter(|_| !files.is_empty()) else {
        return Err(UnpackError::Empty {
            file: file.to_path_buf(),
        });
    };
    evidence::store::fsync_dir(dir).map_err(StoreError::from)?;
    let report = evidence::verify::verify_dir_as(dir, &id);
    if !report.ok() {
        return Err(UnpackError::Verify {
            id,
            errors: report.errors.iter().map(ToString::to_string).collect(),
        });
    }
    Ok(id)
}

/// What [`unpack_into`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landed {
    /// The bundle is now at this path.
    New(PathBuf),
    /// An intact bundle with the same id (same manifest and file hashes) was already
    /// in the store, and verified; nothing changed.
    AlreadyPresent(PathBuf),
    /// The copy already in the store failed verification and was replaced by the
    /// verified copy from the pack (one rename), then removed.
    ReplacedCorrupt {
        /// Where the bundle now is.
        path: PathBuf,
        /// Why the replaced copy failed verification, one text per failure.
        why: Vec<String>,
    },
}

/// Check the pack `file` (read through `reader`) and land its bundle in `store`
/// atomically (see the module docs). Nothing is left in the store on an error.
pub fn unpack_into(store: &Store, file: &Path, reader: impl Read) -> Result<Landed, UnpackError> {
    let tmp = store.staging_root().join(format!(
        ".unpack-{}-{}",
        std::process::id(),
        evidence::clock::monotonic_ns()
    ));
    std::fs::create_dir(&tmp).map_err(|source| UnpackError::Io {
        path: tmp.clone(),
        what: "create",
        source,
    })?;
    let result = read_pack_into(file, reader, &tmp).and_then(|id| land(store, &tmp, &id));
    // After a publish `tmp` is gone; after a replace it holds the corrupt copy.
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Move the verified bundle `tmp` (id `id`) into the store: publish it, or keep an
/// intact copy already there, or swap out a copy that fails verification.
fn land(store: &Store, tmp: &Path, id: &str) -> Result<Landed, UnpackError> {
    let final_dir = store.bundles_dir().join(id);
    if store.publish(tmp, id)? {
        return Ok(Landed::New(final_dir));
    }
    let existing = evidence::verify::verify_dir_as(&final_dir, id);
    if existing.ok() {
        return Ok(Landed::AlreadyPresent(final_dir));
    }
    let old = store.replace(tmp, id)?;
    if old != tmp {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(Landed::ReplacedCorrupt {
        path: final_dir,
        why: existing.errors.iter().map(ToString::to_string).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_entry_tar(name: &str, data: &[u8]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(data.len() as u64);
        h.set_mode(0o444);
        h.set_cksum();
        b.append(&h, data).unwrap();
        b.into_inner().unwrap()
    }

    /// A fresh empty directory under target/ for one test.
    fn scratch(name: &str) -> PathBuf {
        crate::test_kit::scratch(&format!("pack-{name}"))
    }

    fn read_pack(f: &Path, r: &[u8]) -> Result<String, UnpackError> {
        let d = scratch(&format!("read-pack-{}", evidence::clock::monotonic_ns()));
        let out = read_pack_into(f, r, &d);
        let _ = std::fs::remove_dir_all(&d);
        out
    }

    #[test]
    fn cut_short_empty_and_unnamed_packs_are_refused_with_the_entry() {
        let id = "b".repeat(64);
        let f = Path::new("x.tar.zst");
        let zst = |t: &[u8]| zstd::stream::encode_all(t, 3).unwrap();
        // Data cut in the middle of the entry: 700 of 1000 declared bytes.
        let full = one_entry_tar(&format!("{id}/samples.parquet"), &[7u8; 1000]);
        let cut = &full[..512 + 700];
        match read_pack(f, zst(cut).as_slice()) {
            Err(UnpackError::Short {
                entry,
                declared,
                got,
            }) => {
                assert_eq!((declared, got), (1000, 700));
                assert!(entry.ends_with("/samples.parquet"), "{entry}");
            }
            other => panic!("a cut entry must be refused: {other:?}"),
        }
        // Two zero blocks only: a valid, empty tar.
        let empty = vec![0u8; 1024];
        assert!(matches!(
            read_pack(f, zst(&empty).as_slice()),
            Err(UnpackError::Empty { .. })
        ));
        // An entry whose top directory is not an id.
        let e = read_pack(
            f,
            zst(&one_entry_tar("notanid/manifest.json", b"{}")).as_slice(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("\"notanid\" is not a bundle id"),
            "{e}"
        );
        assert_eq!(e.exit_code(), exit::USAGE);
    }

    /// `harness pack` writes only plain ustar regular-file headers, so refusing every
    /// extension header refuses nothing a pack holds.
    #[test]
    fn packs_hold_no_extension_headers() {
        let id = "d".repeat(64);
        let dir = scratch("no-extensions");
        // The bundle's names, and a 100-byte one (the ustar prefix takes the id).
        let long = "n".repeat(100);
        for name in ["manifest.json", "samples.parquet", "markers.parquet", &long] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let tar = tar_bytes(&dir, &id).unwrap();
        let mut a = tar::Archive::new(tar.as_slice());
        let mut n = 0;
        for e in a.entries().unwrap().raw(true) {
            let e = e.unwrap();
            assert_eq!(e.header().entry_type(), tar::EntryType::Regular);
            assert!(e.header().as_ustar().is_some());
            assert!(e.path_bytes().starts_with(id.as_bytes()));
            n += 1;
        }
        assert_eq!(n, 4);
        // A name past the ustar fields is an error, never a long-name header.
        std::fs::write(dir.join("n".repeat(101)), b"x").unwrap();
        let e = tar_bytes(&dir, &id).unwrap_err();
        assert!(e.to_string().contains("does not fit a tar header"), "{e}");
    }

    #[test]
    fn names_in_messages_are_cut() {
        assert_eq!(shown(b"short"), "short");
        let long = vec![b'a'; 32 << 20];
        let s = shown(&long);
        assert!(s.len() < MAX_NAME_SHOWN + 40, "{}", s.len());
        assert!(s.ends_with("(33554432 bytes in all)"), "{s}");
    }

    #[test]
    fn names_are_split_or_refused() {
        let id = "a".repeat(64);
        assert_eq!(
            split_name(&format!("{id}/manifest.json")).unwrap(),
            (id.clone(), Some("manifest.json".into()))
        );
        assert_eq!(split_name(&format!("{id}/")).unwrap(), (id.clone(), None));
        assert_eq!(
            split_name(&format!("./{id}/log.zst")).unwrap(),
            (id.clone(), Some("log.zst".into()))
        );
        for bad in [
            format!("{id}/../x"),
            format!("/{id}/x"),
            format!("{id}/a/b"),
            "../../etc/passwd".to_string(),
            format!("{id}/.."),
        ] {
            assert!(
                matches!(split_name(&bad), Err(UnpackError::Traversal { .. })),
                "{bad}"
            );
        }
    }
}
