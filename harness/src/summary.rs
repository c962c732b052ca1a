//! One bundle's manifest read for people: the fields `ls` and `show` print.

use std::path::Path;
use std::time::UNIX_EPOCH;

use evidence::manifest::Manifest;

use evidence::fragments::{Contention, Fragment, Levers, Run, Rung, Verdicted};

/// A bundle's manifest and where it is.
pub struct BundleSummary {
    /// The bundle id (directory name).
    pub id: String,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Seconds since the Unix epoch when the run started (from `run.start_unix_ns`),
    /// else when the bundle directory was last modified (its seal).
    pub date_unix_s: Option<i64>,
}

impl BundleSummary {
    /// Read `dir/manifest.json` (through [`crate::bundle::manifest`]).
    pub fn load(dir: &Path) -> anyhow::Result<BundleSummary> {
        let manifest = crate::bundle::manifest::read_typed(dir)?;
        let sealed_unix_s = || {
            std::fs::metadata(dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64)
        };
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(BundleSummary::of(id, manifest, sealed_unix_s))
    }

    /// The summary of bundle `id` from its manifest; `sealed_unix_s` gives the
    /// date when the manifest has no start time (a bundle on disk: its
    /// directory's modification time; one in a bucket: none).
    pub fn of(
        id: String,
        manifest: Manifest,
        sealed_unix_s: impl FnOnce() -> Option<i64>,
    ) -> BundleSummary {
        let date_unix_s = manifest
            .run()
            .and_then(|r| r.start_unix_ns)
            .map(|ns| (ns / 1_000_000_000) as i64)
            .or_else(sealed_unix_s);
        BundleSummary {
            id,
            manifest,
            date_unix_s,
        }
    }

    /// The fragment `F` of the manifest, if present and readable.
    pub fn fragment<F: Fragment>(&self) -> Option<F> {
        self.manifest.record()
    }

    /// `rung.name`, or `-`.
    pub fn rung(&self) -> String {
        dash(self.fragment::<Rung>().and_then(|r| r.name))
    }

    /// `lever=arm,...` from the `levers` fragment, or `-`.
    pub fn levers(&self) -> String {
        self.fragment::<Levers>()
            .map_or_else(|| "-".into(), |l| l.joined())
    }

    /// The exit reason, with `*` appended when the bundle is incomplete.
    pub fn exit(&self) -> String {
        let r = self
            .manifest
            .exit()
            .and_then(|e| e.reason)
            .unwrap_or_else(|| "-".into());
        if self.manifest.complete {
            r
        } else {
            format!("{r}*")
        }
    }

    /// Whether the run counts as contended (`contention.flagged`: other work on the
    /// host before the engine started or while it ran); rank excludes such runs.
    pub fn contended(&self) -> bool {
        self.fragment::<Contention>().and_then(|c| c.flagged) == Some(true)
    }

    /// The run's wall in seconds (harness run wall, else engine wall), or `-`.
    pub fn wall(&self) -> String {
        let p = &self.manifest.phases;
        p.run_wall_s
            .or(p.wall_s)
            .map_or_else(|| "-".into(), |w| format!("{w:.1}s"))
    }

    /// `YYYY-MM-DD HH:MM` UTC, or `-`.
    pub fn date(&self) -> String {
        self.date_unix_s.map_or_else(|| "-".into(), utc_minutes)
    }

    /// `run.hostname`, or `-`.
    pub fn host(&self) -> String {
        dash(self.fragment::<Run>().and_then(|r| r.hostname))
    }
}

/// `v`, or `-` when absent.
pub fn dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// Unix seconds as `YYYY-MM-DD HH:MM` (UTC), by the proleptic Gregorian calendar.
pub fn utc_minutes(unix_s: i64) -> String {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400);
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        (secs % 3600) / 60
    )
}

/// A `gates` or `controls` list as `name=verdict` pairs separated by spaces,
/// `-` when absent or empty.
pub fn verdicts(v: Option<&[Verdicted]>) -> String {
    match v {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|g| {
                format!(
                    "{}={}",
                    g.name.as_deref().unwrap_or("?"),
                    g.verdict.as_deref().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(utc_minutes(0), "1970-01-01 00:00");
        assert_eq!(utc_minutes(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc_minutes(1_796_083_200 + 3_660), "2026-12-01 01:01");
    }
}
