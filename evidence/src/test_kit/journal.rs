//! A synthetic run's journal, written THROUGH the evidence crate (nothing writes
//! JSON or Parquet by hand): fragments, marker lines, output lines and sampler
//! rows appended in the order a harness would, then sealed into a store.

use std::path::Path;

use crate::journal::{Record, SharedJournal, Stream};
use crate::marker::Marker;
use crate::sample::Sample;
use crate::seal::Sealed;
use crate::store::{Staging, Store};

/// A journal being written; every append panics on an error (tests only).
pub struct SynthJournal {
    journal: SharedJournal,
    /// The staging directory it lives in, when opened in a store.
    staging: Option<Staging>,
}

impl SynthJournal {
    /// A journal in a new staging directory of `store`.
    pub fn in_store(store: &Store) -> SynthJournal {
        let staging = store.open_staging().expect("open a staging directory");
        let journal = SharedJournal::create(&staging.journal_path()).expect("create the journal");
        SynthJournal {
            journal,
            staging: Some(staging),
        }
    }

    /// A journal at `path` (a dead run's staging directory, made by hand).
    pub fn at(path: &Path) -> SynthJournal {
        SynthJournal {
            journal: SharedJournal::create(path).expect("create the journal"),
            staging: None,
        }
    }

    /// The staging directory's frames directory (where an engine writes its PNGs),
    /// created.
    pub fn frames_dir(&self) -> std::path::PathBuf {
        let d = self
            .staging
            .as_ref()
            .expect("a journal opened in a store")
            .frames_dir();
        std::fs::create_dir_all(&d).expect("create the frames directory");
        d
    }

    /// Append fragment `key`.
    pub fn fragment(&self, key: &str, value: serde_json::Value) {
        self.append(Record::Fragment {
            key: key.into(),
            value,
        });
    }

    /// Append marker `m` as its line, received at `recv_ns` (CLOCK_MONOTONIC ns).
    pub fn marker(&self, recv_ns: u64, m: &Marker) {
        self.append(Record::Marker {
            recv_ns,
            line: m.to_line(),
        });
    }

    /// Append an engine output `line` on `stream` at `t_ns`.
    pub fn output(&self, t_ns: u64, stream: Stream, line: String) {
        self.append(Record::Output { t_ns, stream, line });
    }

    /// Append sampler row `s`.
    pub fn sample(&self, s: Sample) {
        self.append(Record::Sample(s));
    }

    fn append(&self, r: Record) {
        self.journal.append(&r).expect("append to the journal");
    }

    /// Close the journal (a dead run's: nothing sealed).
    pub fn finish(self) {
        self.journal.finish().expect("close the journal");
    }

    /// Close the journal and seal its staging directory into `store`.
    pub fn seal(self, store: &Store) -> Sealed {
        let staging = self
            .staging
            .as_ref()
            .expect("a journal opened in a store")
            .dir()
            .to_path_buf();
        self.journal.finish().expect("close the journal");
        crate::seal::seal(&staging, store).expect("seal the bundle")
    }
}
