//! The typed errors of the bundle machinery (journal, store, seal, verify), of
//! reading a sealed bundle back ([`BundleError`]), of the TOML files both sides
//! read (rung files, the lever spec: [`TomlFileError`]) and of reading a
//! YUV4MPEG2 stream ([`Y4mReadError`]); each defined once, here.
//!
//! Every variant names the file (or directory) it concerns and says what was
//! expected, so a message printed at the binary's edge is enough to act on.

use std::path::PathBuf;

/// An I/O failure on a named path.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {what}: {source}")]
pub struct IoAt {
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done (`"create journal"`, `"fsync"`, ...).
    pub what: &'static str,
    /// The underlying error.
    pub source: std::io::Error,
}

impl IoAt {
    /// Wrap `source` as a failure to `what` on `path`.
    pub fn new(path: impl Into<PathBuf>, what: &'static str, source: std::io::Error) -> Self {
        IoAt {
            path: path.into(),
            what,
            source,
        }
    }
}

/// A closure that turns an `io::Error` into [`IoAt`] for `path`.
pub(crate) fn io_at<'a>(
    path: &'a std::path::Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> IoAt + 'a {
    move |e| IoAt::new(path, what, e)
}

/// The journal could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An I/O error on the journal file.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// The file does not start with the journal magic; it is not a journal.
    #[error("{path}: not a journal (expected the magic header {expected:?}, found {found:?})")]
    NotAJournal {
        /// The file.
        path: PathBuf,
        /// The magic bytes expected.
        expected: String,
        /// What the file starts with.
        found: String,
    },
    /// The journal's format version is not one this crate reads.
    #[error("{path}: journal format version {found}, this build reads version {expected}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version this crate writes and reads.
        expected: u32,
        /// The version in the header.
        found: u32,
    },
    /// A record could not be encoded (a string too long for its length field).
    #[error("cannot encode {what}: {why}")]
    Encode {
        /// The record kind.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// The journal was finished (or its writer failed earlier); no more appends.
    #[error("{path}: journal is closed ({why})")]
    Closed {
        /// The file.
        path: PathBuf,
        /// Why it is closed.
        why: String,
    },
}

/// The store refused a location or could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The durability gate refused a directory.
    #[error("{path}: refused by the durability gate: {rule} (evidence must live on durable storage; pass --store DIR or set HARNESS_STORE to a directory on a persistent disk)")]
    Volatile {
        /// The directory refused.
        path: PathBuf,
        /// The rule that refused it.
        rule: String,
    },
    /// No store location could be derived (no --store, HARNESS_STORE, XDG_DATA_HOME or HOME).
    #[error("no store location: pass --store DIR or set HARNESS_STORE (neither XDG_DATA_HOME nor HOME is set)")]
    NoLocation,
    /// The location is an object-store URL (`s3://...`) where a directory was
    /// needed: the commands that speak S3 handle it before a local store is opened.
    #[error("{location}: an object-store URL where a local store directory is needed (this command reads a store on disk; `harness sync {location} DIR` copies the bundles to one)")]
    NotLocal {
        /// The URL.
        location: String,
    },
    /// An I/O error inside the store.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// No bundle matches an id, prefix or path.
    #[error("{store}: no bundle matches {query:?} (expected a bundle id, an id prefix or a bundle directory)")]
    UnknownBundle {
        /// The store searched.
        store: PathBuf,
        /// What was asked for.
        query: String,
    },
    /// More than one bundle matches an id prefix.
    #[error("{store}: {query:?} matches {count} bundles ({examples}); give more characters")]
    AmbiguousBundle {
        /// The store searched.
        store: PathBuf,
        /// The prefix.
        query: String,
        /// How many matched.
        count: usize,
        /// The first few matches.
        examples: String,
    },
}

/// Sealing a staging directory into a bundle failed; the staging directory is left intact.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The journal could not be read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The store could not be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An I/O error while writing the bundle.
    #[error(transparent)]
    Io(#[from] IoAt),
    /// A Parquet or Arrow error while building a table.
    #[error("building {file}: {why}")]
    Table {
        /// The bundle file being built.
        file: String,
        /// The library's message.
        why: String,
    },
    /// The bundle read back from disk did not verify; nothing was published.
    #[error("read-back of the staged bundle failed, nothing published: {0}")]
    ReadBack(#[from] VerifyError),
}

/// A bundle failed verification. Every variant names the file at fault.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum VerifyError {
    /// A file could not be read.
    #[error("{file}: cannot read: {why}")]
    Unreadable {
        /// The bundle file (relative name).
        file: String,
        /// The I/O error.
        why: String,
    },
    /// `manifest.json` does not hash to the bundle's id.
    #[error(
        "manifest.json: sha256 is {actual}, but the bundle id (its directory name) is {expected}"
    )]
    IdMismatch {
        /// The id the bundle is filed under.
        expected: String,
        /// The manifest's actual sha256.
        actual: String,
    },
    /// `manifest.json` is not canonical JSON of the expected shape.
    #[error("manifest.json: {why}")]
    Manifest {
        /// What was wrong.
        why: String,
    },
    /// A file listed in the manifest is missing.
    #[error("{file}: listed in manifest.json but missing from the bundle")]
    Missing {
        /// The bundle file.
        file: String,
    },
    /// A file in the bundle is not listed in the manifest.
    #[error("{file}: present in the bundle but not listed in manifest.json")]
    Unlisted {
        /// The bundle file.
        file: String,
    },
    /// A file's size differs from the manifest.
    #[error("{file}: {actual} bytes, manifest.json says {expected}")]
    Size {
        /// The bundle file.
        file: String,
        /// Bytes per the manifest.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
    },
    /// A file's sha256 differs from the manifest.
    #[error("{file}: sha256 is {actual}, manifest.json says {expected}")]
    Hash {
        /// The bundle file.
        file: String,
        /// sha256 per the manifest.
        expected: String,
        /// sha256 of the bytes on disk.
        actual: String,
    },
    /// A file is larger than verify reads of its kind (a hostile or damaged bundle).
    #[error("{file}: {bytes} bytes, more than the {limit}-byte limit verify reads of it")]
    TooLarge {
        /// The bundle file.
        file: String,
        /// Its size in bytes.
        bytes: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A table does not have the schema or row count the manifest and spec promise.
    #[error("{file}: {why}")]
    Content {
        /// The bundle file.
        file: String,
        /// What was wrong.
        why: String,
    },
}

/// A TOML file (a rung file, the lever spec) could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TomlFileError {
    /// The file could not be read.
    #[error("{file}: cannot read {what}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// What the file is, in words (`rung file`, `lever spec`).
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML of the expected shape (the parser's message names
    /// the key and line).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A field holds a value outside its domain.
    #[error("{file}: field '{field}': expected {expected}, found {found}")]
    Field {
        /// The file.
        file: PathBuf,
        /// The offending field (for the lever spec, with the lever it belongs
        /// to: `lever "vae".baseline`).
        field: String,
        /// What the field must be.
        expected: String,
        /// What it held.
        found: String,
    },
}

/// A sealed bundle could not be read back (its manifest's facts, its tables).
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The manifest is not JSON.
    #[error("{file}: not JSON: {message}")]
    Json {
        /// The manifest file.
        file: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A manifest field is missing or of the wrong type.
    #[error("{file}: field '{field}': expected {expected}")]
    Field {
        /// The manifest file.
        file: PathBuf,
        /// The field path (`engine.sha256`).
        field: String,
        /// What it must be.
        expected: String,
    },
    /// A Parquet file could not be scanned or lacks a column.
    #[error("{file}: {message}")]
    Parquet {
        /// The Parquet file.
        file: PathBuf,
        /// The Parquet reader's message.
        message: String,
    },
}

/// A stream that is not the YUV4MPEG2 the harness's completion check reads.
#[derive(Debug, thiserror::Error)]
pub enum Y4mReadError {
    /// Reading failed.
    #[error("reading the video failed: {0}")]
    Io(#[from] std::io::Error),
    /// The header line is malformed.
    #[error("header: {0}")]
    Header(String),
    /// A frame is malformed or cut short.
    #[error("frame {index}: {why}")]
    Frame {
        /// 0-based frame index.
        index: u32,
        /// What was wrong.
        why: String,
    },
}
