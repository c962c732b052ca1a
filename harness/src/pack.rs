//! `harness pack` and `harness unpack`: one bundle as one file (tar + zstd) that can
//! travel off a leased box, and back into a store only if every hash checks.
//!
//! A pack is a zstd-compressed tar holding `<id>/manifest.json` first, then every
//! other file of the bundle as `<id>/<name>` in name order, as regular files with
//! fixed metadata (mode 0444, owner 0, mtime 0), so the same bundle always packs
//! to the same bytes. Read it by hand with `zstd -dc F | tar tv`.
//!
//! Unpacking trusts nothing in the file. Every entry must be a regular file named
//! `<id>/<name>` (one 64-hex id for the whole pack, `<name>` one plain component),
//! seen once, declaring at most [`MAX_ENTRY_BYTES`] (at most [`MAX_TOTAL_BYTES`] and
//! [`MAX_ENTRIES`] in all); links, devices, `..`, absolute and nested names are
//! refused before any data is read. The files are then checked in memory by
//! `evidence::verify` (the id is the manifest's sha256, every file's sha256, size,
//! schema and row count), written under `store/staging/.unpack-*`, read back and
//! verified again from disk, and only then renamed into `store/bundles/<id>` in one
//! step, never replacing a bundle. On any refusal nothing is left in the store.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use clap::Args;
use evidence::bundle_files::MANIFEST;
use evidence::store::{is_bundle_id, Store};

use crate::exit::{self, UsageError};
use crate::formats;
use crate::store_arg::{find_bundle, StoreArg};

/// The largest single file a pack may declare: 1 GiB.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// The most a pack may declare in all: 4 GiB.
pub const MAX_TOTAL_BYTES: u64 = 4 << 30;
/// The most entries a pack may hold (a bundle has fewer than ten files).
pub const MAX_ENTRIES: usize = 64;
/// The most memory reserved for one entry before its data is read: 16 MiB.
const INITIAL_READ_CAPACITY: u64 = 16 << 20;
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
}

impl UnpackError {
    /// The exit code: 1 when the files do not verify, 2 for a malformed or hostile pack.
    pub fn exit_code(&self) -> u8 {
        match self {
            UnpackError::Verify { .. } => exit::NEGATIVE,
            _ => exit::USAGE,
        }
    }
}

/// One bundle read out of a pack, checked, in memory.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The bundle id.
    pub id: String,
    /// Every file by name, `manifest.json` included.
    pub files: BTreeMap<String, Vec<u8>>,
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
        other => format!("{other:?}"),
    }
}

/// Check an entry name: `<id>/<file>` with `<file>` one plain component, or `<id>`
/// (a directory entry). Returns (id, file name or None for the directory).
fn split_name(entry: &str) -> Result<(String, Option<String>), UnpackError> {
    let traversal = || UnpackError::Traversal {
        entry: entry.to_string(),
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

/// Read and check a pack (see the module docs); nothing is written.
pub fn read_pack(file: &Path, reader: impl Read) -> Result<Unpacked, UnpackError> {
    let unreadable = |why: String| UnpackError::Unreadable {
        file: file.to_path_buf(),
        why,
    };
    let dec = zstd::stream::read::Decoder::new(reader).map_err(|e| unreadable(e.to_string()))?;
    let mut archive = tar::Archive::new(dec);
    let entries = archive.entries().map_err(|e| unreadable(e.to_string()))?;
    let mut id: Option<String> = None;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut seen_dir = false;
    let (mut total, mut count) = (0u64, 0usize);
    for e in entries {
        let mut e = e.map_err(|e| unreadable(e.to_string()))?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(UnpackError::TooLarge {
                why: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        let entry = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let ty = e.header().entry_type();
        if ty.is_symlink() || ty.is_hard_link() {
            let target = e
                .link_name_bytes()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
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
        let (eid, name) = split_name(&entry)?;
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
        if files.contains_key(&name) {
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
        // Grow with the data actually read: a header's declared size is not trusted
        // with memory up front.
        let mut bytes = Vec::with_capacity(declared.min(INITIAL_READ_CAPACITY) as usize);
        let got = (&mut e)
            .take(declared)
            .read_to_end(&mut bytes)
            .map_err(|err| unreadable(format!("entry {entry:?}: {err}")))? as u64;
        if got != declared {
            return Err(UnpackError::Short {
                entry,
                declared,
                got,
            });
        }
        files.insert(name, bytes);
    }
    let Some(id) = id.filter(|_| !files.is_empty()) else {
        return Err(UnpackError::Empty {
            file: file.to_path_buf(),
        });
    };
    let errors = evidence::verify::verify_files(&id, &files);
    if !errors.is_empty() {
        return Err(UnpackError::Verify {
            id,
            errors: errors.iter().map(ToString::to_string).collect(),
        });
    }
    Ok(Unpacked { id, files })
}

/// What [`land`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landed {
    /// The bundle is now at this path.
    New(PathBuf),
    /// An identical bundle (same id) was already in the store; nothing changed.
    AlreadyPresent(PathBuf),
}

fn write_durably(p: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Write a checked bundle into `store` atomically (see the module docs).
pub fn land(store: &Store, u: &Unpacked) -> anyhow::Result<Landed> {
    let final_dir = store.bundles_dir().join(&u.id);
    if final_dir.exists() {
        return Ok(Landed::AlreadyPresent(final_dir));
    }
    let tmp = store.staging_root().join(format!(
        ".unpack-{}-{}",
        std::process::id(),
        evidence::clock::monotonic_ns()
    ));
    let result = (|| -> anyhow::Result<Landed> {
        std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        for (name, bytes) in &u.files {
            let p = tmp.join(name);
            write_durably(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        }
        evidence::store::fsync_dir(&tmp)?;
        let report = evidence::verify::verify_dir_as(&tmp, &u.id);
        if !report.ok() {
            anyhow::bail!(
                "{}: the written bundle does not read back: {}",
                tmp.display(),
                report
                    .errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        if store.publish(&tmp, &u.id)? {
            Ok(Landed::New(final_dir.clone()))
        } else {
            Ok(Landed::AlreadyPresent(final_dir.clone()))
        }
    })();
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Pack one bundle into one file.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// A bundle id, a unique id prefix, or a bundle directory.
    pub bundle: String,
    /// Output file (default `<id12>.bundle.tar.zst`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The store (`--store`, `$HARNESS_STORE`); ids are resolved through it.
    #[command(flatten)]
    pub store: StoreArg,
}

/// Check a pack and add its bundle to the store.
#[derive(Debug, Args)]
pub struct UnpackArgs {
    /// The pack file (`harness pack` output).
    pub file: PathBuf,
    /// The store the bundle lands in (`--store`, `$HARNESS_STORE`).
    #[command(flatten)]
    pub store: StoreArg,
}

/// Exit 0 with the pack written; 1 when the bundle does not verify (nothing written).
pub fn pack(args: PackArgs) -> anyhow::Result<u8> {
    let dir = find_bundle(&args.store, &args.bundle)?;
    let report = evidence::verify::verify_dir(&dir);
    if !report.ok() {
        for e in &report.errors {
            eprintln!("harness: {}: {e}", dir.display());
        }
        eprintln!(
            "harness: not packing {}: it fails verification ({} problem(s))",
            report.id,
            report.errors.len()
        );
        return Ok(exit::NEGATIVE);
    }
    let bytes = pack_bytes(&dir, &report.id)?;
    let out = args
        .out
        .unwrap_or_else(|| formats::default_out(&report.id, "bundle.tar.zst"));
    formats::write_file(&out, &bytes)?;
    println!(
        "packed {} ({} files) into {} ({} bytes)",
        report.id,
        report.files,
        out.display(),
        bytes.len()
    );
    Ok(exit::OK)
}

/// Exit 0 when the bundle is in the store (new or already there); 1 when its files
/// do not verify; 2 for a malformed or hostile pack. Nothing is left behind on a refusal.
pub fn unpack(args: UnpackArgs) -> anyhow::Result<u8> {
    let f = std::fs::File::open(&args.file)
        .map_err(|e| UsageError(format!("{}: cannot open: {e}", args.file.display())))?;
    let u = match read_pack(&args.file, std::io::BufReader::new(f)) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("harness: {}: {e}", args.file.display());
            return Ok(e.exit_code());
        }
    };
    let store = args.store.open()?;
    match land(&store, &u)? {
        Landed::New(p) => println!("unpacked {} into {} (verified)", u.id, p.display()),
        Landed::AlreadyPresent(p) => {
            println!(
                "{} is already in the store at {} (same id: same manifest and file hashes; not replaced)",
                u.id,
                p.display()
            )
        }
    }
    Ok(exit::OK)
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
