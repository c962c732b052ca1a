//! The watchdog's limits and their check on one sampler row: the part of the
//! watchdog that runs inside the sampler (see [`crate::control::watchdog`]).

use evidence::sample::Sample;

/// The floor used when `--mem-floor` is not given: the smaller of this and
/// [`DEFAULT_FLOOR_SHARE`] of MemTotal, in bytes.
///
/// 4 GiB leaves the kernel, the page cache of the harness's own journal and a
/// shell room to work when the engine is killed; on small boxes an eighth of RAM
/// is kept instead so the floor does not forbid every run.
pub const DEFAULT_FLOOR_BYTES: u64 = 4 << 30;
/// See [`DEFAULT_FLOOR_BYTES`].
pub const DEFAULT_FLOOR_SHARE: f64 = 1.0 / 8.0;

/// The watchdog's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Kill when MemAvailable falls below this, bytes.
    pub mem_floor_bytes: u64,
    /// Kill when `unified_bytes` rises above this, bytes.
    pub unified_budget_bytes: Option<u64>,
}

/// The reading that tripped the watchdog.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trip {
    /// The column that crossed its limit.
    pub column: String,
    /// Its value, bytes.
    pub value: u64,
    /// The limit, bytes.
    pub limit: u64,
    /// The sample's CLOCK_MONOTONIC time, nanoseconds.
    pub t_ns: u64,
}

/// The default floor for a machine with `mem_total` bytes.
pub fn default_floor(mem_total: u64) -> u64 {
    DEFAULT_FLOOR_BYTES.min((mem_total as f64 * DEFAULT_FLOOR_SHARE) as u64)
}

impl Limits {
    /// The first limit `s` crosses, if any. A missing reading crosses nothing.
    pub fn check(&self, s: &Sample) -> Option<Trip> {
        if let Some(v) = s.get("mem_available_bytes") {
            if (v as u64) < self.mem_floor_bytes {
                return Some(Trip {
                    column: "mem_available_bytes".into(),
                    value: v as u64,
                    limit: self.mem_floor_bytes,
                    t_ns: s.t_ns,
                });
            }
        }
        if let (Some(budget), Some(v)) = (self.unified_budget_bytes, s.get("unified_bytes")) {
            if v as u64 > budget {
                return Some(Trip {
                    column: "unified_bytes".into(),
                    value: v as u64,
                    limit: budget,
                    t_ns: s.t_ns,
                });
            }
        }
        None
    }

    /// The `watchdog` manifest fragment.
    pub fn fragment(&self, trip: Option<&Trip>) -> evidence::fragments::Watchdog {
        evidence::fragments::Watchdog {
            mem_floor_bytes: self.mem_floor_bytes,
            unified_budget_bytes: self.unified_budget_bytes,
            tripped: trip.and_then(|t| serde_json::to_value(t).ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(avail: Option<f64>, unified: Option<f64>) -> Sample {
        let mut s = Sample::empty(42);
        s.set("mem_available_bytes", avail);
        s.set("unified_bytes", unified);
        s
    }

    #[test]
    fn floor_and_budget_trip_on_the_right_side() {
        let l = Limits {
            mem_floor_bytes: 1000,
            unified_budget_bytes: Some(5000),
        };
        assert_eq!(l.check(&row(Some(1000.0), Some(5000.0))), None);
        let t = l.check(&row(Some(999.0), Some(10.0))).unwrap();
        assert_eq!(
            (t.column.as_str(), t.value, t.limit, t.t_ns),
            ("mem_available_bytes", 999, 1000, 42)
        );
        let t = l.check(&row(Some(2000.0), Some(5001.0))).unwrap();
        assert_eq!(
            (t.column.as_str(), t.value, t.limit),
            ("unified_bytes", 5001, 5000)
        );
        // Unreadable sensors never trip (and never pass as 0).
        assert_eq!(l.check(&row(None, None)), None);
        let no_budget = Limits {
            mem_floor_bytes: 0,
            unified_budget_bytes: None,
        };
        assert_eq!(no_budget.check(&row(Some(0.0), Some(1e18))), None);
    }

    #[test]
    fn default_floor_is_the_smaller_of_4gib_and_an_eighth() {
        assert_eq!(default_floor(128 << 30), 4 << 30);
        assert_eq!(default_floor(16 << 30), 2 << 30);
    }

    #[test]
    fn fragment_names_the_trip() {
        let l = Limits {
            mem_floor_bytes: 7,
            unified_budget_bytes: None,
        };
        let t = l.check(&row(Some(3.0), None));
        let f = serde_json::to_value(l.fragment(t.as_ref())).unwrap();
        assert_eq!(f["tripped"]["column"], "mem_available_bytes");
        assert_eq!(f["tripped"]["value"], 3);
        assert_eq!(f["unified_budget_bytes"], serde_json::Value::Null);
    }
}
