//! Which bundles a campaign has already sealed: in this machine's store (each
//! verified in full, as a campaign's resume always did) and, for a campaign
//! whose rounds run on many machines, in the bucket they publish to (each
//! committed bundle's manifest, checked against its id: the data objects are
//! created before the manifest, so a committed manifest is a whole bundle).

use std::path::Path;

use serde_json::Value;

use crate::bundle::facts::Bundle;
use crate::bundle::{files, manifest};
use crate::remote::reader::Remote;
use crate::remote::S3Location;
use crate::verification::local::{partition, VerifyCache};
use evidence::fragments::{self, Schedule};

/// A sealed bundle that is not complete, as its manifest's `schedule` names it
/// (read from the manifest alone: a run stopped before its engine started has
/// too few facts for rank, but its position is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The bundle id.
    pub id: String,
    /// Its campaign id.
    pub campaign: String,
    /// Its schedule position.
    pub position: u32,
}

/// The lease a bundle of a campaign ran under, as its manifest's `lease` and
/// `schedule` say (complete or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// Its campaign id.
    pub campaign: String,
    /// The lease id (`slurm:<job>_<round>` for a Slurm task's run).
    pub lease: String,
    /// The Slurm node it ran on, where the run recorded one.
    pub node: Option<String>,
}

/// What a campaign finds sealed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The facts of every bundle readable as rank reads them (complete or not).
    pub bundles: Vec<Bundle>,
    /// Every bundle sealed incomplete that names a campaign position.
    pub unfinished: Vec<Unfinished>,
    /// The lease of every bundle that names a campaign position and a lease.
    pub leases: Vec<Leased>,
}

impl Found {
    /// Add one manifest's findings: its facts (when they read) and, when it is not
    /// complete, its schedule position.
    fn add(&mut self, id: &str, m: &Value, facts: Result<Bundle, String>, shown: &str) {
        if let (Ok(Some(s)), Ok(Some(l))) = (
            fragments::read::<Schedule>(m),
            fragments::read::<fragments::Lease>(m),
        ) {
            self.leases.push(Leased {
                campaign: s.campaign,
                lease: l.id,
                node: l.node,
            });
        }
        if m["complete"] == Value::Bool(false) {
            if let Ok(Some(s)) = fragments::read::<Schedule>(m) {
                self.unfinished.push(Unfinished {
                    id: id.to_string(),
                    campaign: s.campaign,
                    position: s.position,
                });
            }
        }
        match facts {
            Ok(b) => self.bundles.push(b),
            // Incomplete runs often lack facts rank needs; only a complete one
            // that does not read is worth a word.
            Err(why) if m["complete"] == Value::Bool(true) => eprintln!(
                "harness campaign: not counted: {shown}: {}",
                crate::redact::urls(&crate::escape::terminal(&why))
            ),
            Err(_) => {}
        }
    }
}

/// Every bundle sealed in the store at `root` that verifies (nothing when the
/// store cannot be listed yet); one that does not is named on stderr and its
/// position runs again.
pub fn local(root: &Path) -> Found {
    let mut out = Found::default();
    let Ok(dirs) = files::store_bundle_dirs(root) else {
        return out;
    };
    let (ok, bad) = partition(&dirs, &mut VerifyCache::in_process());
    for b in &bad {
        eprintln!("harness campaign: not counted: {}: {}", b.id, b.reason);
    }
    for d in ok {
        let Ok(m) = manifest::read_json(&d) else {
            continue;
        };
        let id = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let facts = manifest::read_facts(&d).map_err(|e| e.to_string());
        out.add(&id, &m, facts, &d.display().to_string());
    }
    out
}

/// Every committed bundle of the bucket at `loc` whose manifest hashes to its id
/// and parses; one that does not is named on stderr and not counted.
pub fn in_bucket(loc: &S3Location) -> anyhow::Result<Found> {
    let remote = Remote::new(crate::remote::open(loc)?);
    let listing = remote.bucket().list_bundles()?;
    let mut out = Found::default();
    for id in crate::remote::fetch::committed(&listing) {
        let url = loc.bundle_url(&id);
        let dir = Path::new(&url);
        let file = dir.join(evidence::bundle_files::MANIFEST);
        let m: Result<Value, String> = remote
            .manifest_bytes(&id)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        match m {
            Ok(m) => {
                let facts = manifest::manifest_facts(&m, &file, dir).map_err(|e| e.to_string());
                out.add(&id, &m, facts, &url);
            }
            Err(why) => eprintln!(
                "harness campaign: not counted: {url}: {}",
                crate::redact::urls(&crate::escape::terminal(&why))
            ),
        }
    }
    Ok(out)
}

/// Both: what the local store at `root` and, with `loc`, the bucket hold (a
/// bundle in both is listed twice; positions are sets, ids are deduplicated
/// where counted).
pub fn everywhere(root: &Path, loc: Option<&S3Location>) -> anyhow::Result<Found> {
    let mut all = local(root);
    if let Some(l) = loc {
        let b = in_bucket(l)?;
        all.bundles.extend(b.bundles);
        all.unfinished.extend(b.unfinished);
        all.leases.extend(b.leases);
    }
    Ok(all)
}
