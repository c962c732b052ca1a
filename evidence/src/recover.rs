//! Recovery: every staging directory whose run is gone becomes a sealed,
//! incomplete bundle, keeping every intact journal record.
//!
//! A staging directory is gone when nobody holds its lock (a live run holds it
//! for its whole life). Its exit reason is the journal's own `exit` fragment when
//! the run wrote one before dying; otherwise `host-lost` when the `run`
//! fragment's boot_id differs from this boot's (the box rebooted under the run),
//! else `harness-killed`. A directory whose seal was interrupted after publishing
//! is only cleaned up.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{SealError, StoreError};
use crate::fragments::{Exit, Fragment, Run};
use crate::journal::Record;
use crate::seal::{finish_staging, read_staging_journal, recovered_exit, seal_contents, Sealed};
use crate::store::{try_lock_staging, Store, SEALED_FILE};

/// Where the kernel publishes this boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id, if readable.
pub fn current_boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID_PATH)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// What happened to one staging directory.
#[derive(Debug)]
pub enum Outcome {
    /// Sealed as a bundle with this exit reason.
    Sealed {
        /// The staging directory (now removed).
        staging: PathBuf,
        /// The bundle.
        sealed: Sealed,
        /// The exit reason recorded.
        reason: String,
    },
    /// Its seal had been published; the leftovers were removed.
    Cleaned {
        /// The staging directory (now removed).
        staging: PathBuf,
        /// The bundle id it had been sealed as.
        id: String,
    },
    /// A live process holds its lock; left alone.
    Busy {
        /// The staging directory.
        staging: PathBuf,
    },
    /// Could not be sealed; left intact.
    Failed {
        /// The staging directory.
        staging: PathBuf,
        /// Why.
        error: SealError,
    },
}

/// The exit reason and detail for a journal without an `exit` fragment.
pub fn exit_for(run_boot_id: Option<&str>, this_boot: Option<&str>) -> (&'static str, String) {
    match (run_boot_id, this_boot) {
        (Some(r), Some(t)) if r != t => (
            "host-lost",
            format!("recovered: the run's boot_id {r} differs from this boot's {t}; the host restarted under the run"),
        ),
        (Some(r), _) => (
            "harness-killed",
            format!("recovered: same boot ({r}); the harness ended without sealing"),
        ),
        (None, _) => (
            "harness-killed",
            "recovered: the journal has no run fragment, so the boot is unknown; the harness ended without sealing".to_string(),
        ),
    }
}

/// Recover one staging directory (see the module docs).
pub fn recover_one(store: &Store, staging: &Path, this_boot: Option<&str>) -> Outcome {
    let staging_buf = staging.to_path_buf();
    let failed = |error: SealError| Outcome::Failed {
        staging: staging_buf.clone(),
        error,
    };
    let _lock = match try_lock_staging(staging) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Outcome::Busy {
                staging: staging_buf,
            }
        }
        Err(e) => return failed(e.into()),
    };
    let sealed_marker = staging.join(SEALED_FILE);
    if let Ok(id) = std::fs::read_to_string(&sealed_marker) {
        let id = id.trim().to_string();
        if store.bundles_dir().join(&id).is_dir() {
            return match finish_staging(store, staging, &id) {
                Ok(()) => Outcome::Cleaned {
                    staging: staging_buf,
                    id,
                },
                Err(e) => failed(e),
            };
        }
    }
    let contents = match read_staging_journal(staging) {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    // The last `exit` written (any value, null too: the run wrote one) and its
    // reason; the last `run`'s boot id. Both read leniently, as the seal does.
    let mut exit: Option<Option<String>> = None;
    let mut boot: Option<String> = None;
    for r in &contents.records {
        if let Record::Fragment { key, value } = r {
            if key == Exit::KEY {
                exit = Some(Exit::deserialize(value).ok().and_then(|e| e.reason));
            } else if key == Run::KEY {
                boot = Run::deserialize(value).ok().and_then(|r| r.boot_id);
            }
        }
    }
    let (extra, reason) = match exit {
        Some(reason) => (Vec::new(), reason.unwrap_or_else(|| "unknown".into())),
        None => {
            let (reason, detail) = exit_for(boot.as_deref(), this_boot);
            (
                vec![(Exit::KEY.to_string(), recovered_exit(reason, detail))],
                reason.to_string(),
            )
        }
    };
    match seal_contents(staging, store, &contents, extra) {
        Ok(sealed) => Outcome::Sealed {
            staging: staging_buf,
            sealed,
            reason,
        },
        Err(e) => failed(e),
    }
}

/// Recover every staging directory of `store`, in name order.
pub fn recover_all(store: &Store) -> Result<Vec<Outcome>, StoreError> {
    let boot = current_boot_id();
    Ok(store
        .staging_dirs()?
        .iter()
        .map(|d| recover_one(store, d, boot.as_deref()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_reason_follows_the_boot_id() {
        assert_eq!(exit_for(Some("a"), Some("b")).0, "host-lost");
        assert_eq!(exit_for(Some("a"), Some("a")).0, "harness-killed");
        assert_eq!(exit_for(None, Some("a")).0, "harness-killed");
        assert!(exit_for(Some("a"), Some("b"))
            .1
            .contains("a differs from this boot's b"));
        assert!(current_boot_id().is_some_and(|b| b.len() == 36));
    }
}
