//! Verification: re-read every file of a bundle, recompute every hash, check
//! every table against its schema and the manifest.
//!
//! Checks, each failure naming its file:
//! * `manifest.json` hashes to the bundle id (its directory name) and is the
//!   canonical encoding of a schema-1 manifest;
//! * every listed file exists with the listed size and sha256, and no unlisted
//!   file is present;
//! * every Parquet table decodes completely, has exactly its documented columns
//!   (types, nullability, unit/window/source metadata) and the listed row count;
//!   `log.zst` decompresses to the listed number of lines; images are PNG;
//! * the manifest's counts agree with the tables (samples, phases, marker lines).
//!
//! A single flipped byte anywhere is therefore caught: in `manifest.json` by the
//! id, elsewhere by the file's sha256.

use std::collections::BTreeMap;
use std::path::Path;

use crate::bundle_files::{self, LOG, MANIFEST};
use crate::error::VerifyError;
use crate::manifest::{sha256_hex, Manifest};
use crate::parquet_tables;

/// The outcome of verifying one bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// The id the bundle was checked against.
    pub id: String,
    /// Files read (manifest included).
    pub files: usize,
    /// Every failure found; empty when the bundle verifies.
    pub errors: Vec<VerifyError>,
}

impl VerifyReport {
    /// True when no check failed.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Verify the bundle directory `dir` against the id it is named by.
pub fn verify_dir(dir: &Path) -> VerifyReport {
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    verify_dir_as(dir, &id)
}

/// Verify the bundle directory `dir` against `id`.
pub fn verify_dir_as(dir: &Path, id: &str) -> VerifyReport {
    let mut files = BTreeMap::new();
    let mut errors = Vec::new();
    match std::fs::read_dir(dir) {
        Err(e) => errors.push(VerifyError::Unreadable {
            file: dir.display().to_string(),
            why: e.to_string(),
        }),
        Ok(rd) => {
            for e in rd {
                let e = match e {
                    Ok(e) => e,
                    Err(err) => {
                        errors.push(VerifyError::Unreadable {
                            file: dir.display().to_string(),
                            why: err.to_string(),
                        });
                        continue;
                    }
                };
                let name = e.file_name().to_string_lossy().into_owned();
                let p = e.path();
                if !p.is_file() {
                    errors.push(VerifyError::Unlisted { file: name });
                    continue;
                }
                match std::fs::read(&p) {
                    Ok(b) => {
                        files.insert(name, b);
                    }
                    Err(err) => errors.push(VerifyError::Unreadable {
                        file: name,
                        why: err.to_string(),
                    }),
                }
            }
        }
    }
    let n = files.len();
    errors.extend(verify_files(id, &files));
    VerifyReport {
        id: id.to_string(),
        files: n,
        errors,
    }
}

/// Verify a bundle given as file name -> bytes (`manifest.json` included).
pub fn verify_files(id: &str, files: &BTreeMap<String, Vec<u8>>) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let Some(mbytes) = files.get(MANIFEST) else {
        return vec![VerifyError::Missing {
            file: MANIFEST.into(),
        }];
    };
    let actual = sha256_hex(mbytes);
    if actual != id {
        errors.push(VerifyError::IdMismatch {
            expected: id.to_string(),
            actual,
        });
    }
    let manifest = match std::str::from_utf8(mbytes)
        .map_err(|e| format!("not UTF-8: {e}"))
        .and_then(Manifest::from_json)
    {
        Ok(m) => m,
        Err(why) => {
            errors.push(VerifyError::Manifest { why });
            return errors;
        }
    };
    if manifest.canonical_bytes() != *mbytes {
        errors.push(VerifyError::Manifest {
            why: "not in canonical form (sorted keys, compact, stable numbers)".into(),
        });
    }
    for name in files.keys() {
        if name != MANIFEST && !manifest.files.contains_key(name) {
            errors.push(VerifyError::Unlisted { file: name.clone() });
        }
    }
    for required in [
        bundle_files::SAMPLES,
        bundle_files::PHASES,
        bundle_files::MARKERS,
        LOG,
    ] {
        if !manifest.files.contains_key(required) {
            errors.push(VerifyError::Manifest {
                why: format!("files lacks the required {required}"),
            });
        }
    }
    for (name, entry) in &manifest.files {
        let Some(bytes) = files.get(name) else {
            errors.push(VerifyError::Missing { file: name.clone() });
            continue;
        };
        if bytes.len() as u64 != entry.bytes {
            errors.push(VerifyError::Size {
                file: name.clone(),
                expected: entry.bytes,
                actual: bytes.len() as u64,
            });
            continue;
        }
        let h = sha256_hex(bytes);
        if h != entry.sha256 {
            errors.push(VerifyError::Hash {
                file: name.clone(),
                expected: entry.sha256.clone(),
                actual: h,
            });
            continue;
        }
        if let Err(why) = check_content(name, bytes, entry.rows, &manifest) {
            errors.push(VerifyError::Content {
                file: name.clone(),
                why,
            });
        }
    }
    errors
}

fn check_content(name: &str, bytes: &[u8], rows: Option<u64>, m: &Manifest) -> Result<(), String> {
    if let Some(schema) = parquet_tables::schema_for(name) {
        let t = parquet_tables::read_table(bytes, &schema)?;
        if Some(t.rows) != rows {
            return Err(format!("{} rows, manifest.json says {rows:?}", t.rows));
        }
        let counted = match name {
            bundle_files::SAMPLES => Some(("cadence.samples", m.cadence.samples)),
            bundle_files::PHASES => Some(("phases.instances", m.phases.instances)),
            bundle_files::MARKERS => Some(("markers.lines", m.markers.lines)),
            _ => None,
        };
        if let Some((key, n)) = counted {
            if n != t.rows {
                return Err(format!("{} rows, manifest.json {key} says {n}", t.rows));
            }
        }
        return Ok(());
    }
    if name == LOG {
        let text = zstd::stream::decode_all(bytes).map_err(|e| format!("not zstd: {e}"))?;
        let lines = text.iter().filter(|&&b| b == b'\n').count() as u64;
        if Some(lines) != rows {
            return Err(format!("{lines} lines, manifest.json says {rows:?}"));
        }
        return Ok(());
    }
    if name.ends_with(".png") {
        if !bytes.starts_with(PNG_SIGNATURE) {
            return Err("not a PNG image".into());
        }
        return Ok(());
    }
    Err("not a file a schema-1 bundle holds".into())
}
