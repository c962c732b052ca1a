//! The one cache of verification results, kept by the local store's
//! interactive readers ([`crate::verification::local`]: bundle ids with their
//! files' stamps): what verified is remembered outside the store, with a stamp
//! of what was read, and taken as verified again only while [`StampCache::trusted`]
//! says so. A cache that cannot be read or written is ignored: it only saves time.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Keys that verified, each with the stamp `S` of what was read then, kept in one
/// JSON file (`{"store": ..., <field>: {key: stamp, ...}}`).
#[derive(Debug)]
pub struct StampCache<S> {
    path: Option<PathBuf>,
    store: String,
    field: &'static str,
    entries: BTreeMap<String, S>,
    dirty: bool,
}

impl<S: Serialize + DeserializeOwned + PartialEq> StampCache<S> {
    /// The cache kept at `path` (`None`: caching is off) for the store named
    /// `store`, its entries under `field`; empty when it cannot be read.
    /// A cache file is read only when this user owns it and nobody else may
    /// write it (the directory is checked by `cache_dir`): a planted file is
    /// ignored.
    pub fn open(path: Option<PathBuf>, store: String, field: &'static str) -> StampCache<S> {
        let entries = path
            .as_ref()
            .filter(|p| owned_privately(p))
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|mut v| v.get_mut(field).map(Value::take))
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        StampCache {
            path,
            store,
            field,
            entries,
            dirty: false,
        }
    }

    /// The trust decision, made here alone: whether `key`, stamped `now`, may be
    /// taken as verified without reading it again. Today: it verified before and
    /// its stamp is exactly as it was then.
    pub fn trusted(&self, key: &str, now: &S) -> bool {
        self.entries.get(key) == Some(now)
    }

    /// Remember that `key`, stamped `stamp`, verified.
    pub fn remember(&mut self, key: String, stamp: S) {
        self.entries.insert(key, stamp);
        self.dirty = true;
    }

    /// Forget `key` (it failed verification).
    pub fn forget(&mut self, key: &str) {
        if self.entries.remove(key).is_some() {
            self.dirty = true;
        }
    }

    /// Keep what verified for the next command (through a temporary file and a
    /// rename; failures are ignored: the cache only saves time).
    pub fn save(&self) {
        let (Some(path), true) = (&self.path, self.dirty) else {
            return;
        };
        let Some(parent) = path.parent() else {
            return;
        };
        let mut doc = serde_json::Map::new();
        doc.insert("store".into(), Value::String(self.store.clone()));
        let Ok(entries) = serde_json::to_value(&self.entries) else {
            return;
        };
        doc.insert(self.field.into(), entries);
        let Ok(bytes) = serde_json::to_vec(&doc) else {
            return;
        };
        let tmp = path.with_extension(format!("json.{}.part", std::process::id()));
        let ok = std::fs::create_dir_all(parent).is_ok()
            && std::fs::write(&tmp, bytes).is_ok()
            && std::fs::rename(&tmp, path).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Whether `p` is a regular file owned by this user and not writable by its
/// group or others.
fn owned_privately(p: &std::path::Path) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::symlink_metadata(p).is_ok_and(|m| {
        // SAFETY: geteuid has no failure mode.
        m.is_file() && m.uid() == unsafe { libc::geteuid() } && m.permissions().mode() & 0o022 == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_trusted_only_with_the_stamp_it_verified_with_and_survives_a_save() {
        let d =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch/stamp-cache");
        let _ = std::fs::remove_dir_all(&d);
        let p = d.join("c.json");
        let mut c: StampCache<u64> = StampCache::open(Some(p.clone()), "s".into(), "verified");
        assert!(!c.trusted("a", &1));
        c.remember("a".into(), 1);
        c.remember("b".into(), 2);
        c.forget("b");
        c.save();
        let c: StampCache<u64> = StampCache::open(Some(p.clone()), "s".into(), "verified");
        assert!(c.trusted("a", &1));
        assert!(!c.trusted("a", &2));
        assert!(!c.trusted("b", &2));
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["store"], "s");
        assert_eq!(v["verified"]["a"], 1);
    }
}
