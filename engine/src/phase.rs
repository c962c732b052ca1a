//! Phases as the render emits them: marker open/close/tick through the shared
//! [`Emitter`], with every close carrying `peak_host_bytes` (and how it was
//! measured, `peak_host_source`) from one [`PeakTracker`].

use std::sync::Mutex;

use evidence::marker::{attr, Attrs, Emitter};
use serde_json::Value;

use crate::hostmem::PeakTracker;

/// Attribute naming how `peak_host_bytes` was measured.
pub const PEAK_HOST_SOURCE: &str = "peak_host_source";

/// The render's phase recorder.
pub struct Recorder {
    emitter: Emitter,
    mem: Mutex<PeakTracker>,
}

impl Recorder {
    /// A recorder writing through `emitter`.
    pub fn new(emitter: Emitter) -> Self {
        Recorder {
            emitter,
            mem: Mutex::new(PeakTracker::new()),
        }
    }

    /// The emitter (hello, info).
    pub fn emitter(&self) -> &Emitter {
        &self.emitter
    }

    /// Open phase `name` with `attrs`; close it with [`Phase::finish`].
    pub fn phase(&self, name: &str, attrs: Attrs) -> Phase<'_> {
        // Marker first, then the memory reading, so the reading's cost falls
        // inside the phase rather than in an unmarked gap.
        self.emitter.open(name, attrs);
        self.mem.lock().unwrap_or_else(|p| p.into_inner()).open();
        Phase {
            rec: self,
            name: name.to_string(),
            done: false,
        }
    }

    /// An instant inside the current phase.
    pub fn tick(&self, name: &str, attrs: Attrs) {
        self.emitter.tick(name, attrs);
    }

    fn close(&self, name: &str, mut attrs: Attrs) {
        let (peak, src) = {
            let mut m = self.mem.lock().unwrap_or_else(|p| p.into_inner());
            (m.close(), m.source())
        };
        attrs.insert(attr::PEAK_HOST_BYTES.into(), Value::from(peak));
        attrs.insert(PEAK_HOST_SOURCE.into(), Value::from(src.as_str()));
        self.emitter.close(name, attrs);
    }
}

/// An open phase; dropping it unfinished closes it marked aborted.
pub struct Phase<'a> {
    rec: &'a Recorder,
    name: String,
    done: bool,
}

impl Phase<'_> {
    /// Close with `attrs` (peak host bytes are added).
    pub fn finish(mut self, attrs: Attrs) {
        self.done = true;
        self.rec.close(&self.name, attrs);
    }
}

impl Drop for Phase<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut a = Attrs::new();
            a.insert(attr::ABORTED.into(), Value::Bool(true));
            self.rec.close(&self.name, a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evidence::marker::{parse_marker_line, Marker};
    use std::io::Write;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn closes_carry_peaks_and_aborts_are_marked() {
        let buf = Buf::default();
        let r = Recorder::new(Emitter::to_writer(Box::new(buf.clone()), false));
        let outer = r.phase("denoise", Attrs::new());
        {
            let _inner = r.phase("denoise.step", Attrs::new());
        }
        outer.finish(Attrs::new());
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let ms: Vec<Marker> = text
            .lines()
            .map(|l| parse_marker_line(l).unwrap())
            .collect();
        assert_eq!(ms.len(), 4);
        let step_close = &ms[2];
        assert_eq!(step_close.name(), Some("denoise.step"));
        assert_eq!(step_close.attrs()[attr::ABORTED], Value::Bool(true));
        let outer_close = ms[3].attrs();
        let p_outer = outer_close[attr::PEAK_HOST_BYTES].as_u64().unwrap();
        let p_inner = step_close.attrs()[attr::PEAK_HOST_BYTES].as_u64().unwrap();
        assert!(p_outer >= p_inner && p_inner > 0, "{p_outer} {p_inner}");
        assert!(outer_close.contains_key(PEAK_HOST_SOURCE));
    }
}
