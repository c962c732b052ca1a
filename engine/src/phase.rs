//! Phases as the render emits them: marker open/close/tick through the shared
//! [`Emitter`], with every close carrying `peak_host_bytes` (and how it was
//! measured, `peak_host_source`) from one [`PeakTracker`], and, once a device is
//! attached ([`Recorder::attach_device`]), `peak_device_bytes`: the device
//! allocator's high-water mark within the phase, its children's included.

use std::sync::{Arc, Mutex};

use evidence::marker::{attr, Attrs, Emitter};
use serde_json::Value;

use crate::hostmem::PeakTracker;

/// Attribute naming how `peak_host_bytes` was measured.
pub const PEAK_HOST_SOURCE: &str = "peak_host_source";

/// A device allocator's high-water mark.
pub trait DevicePeak: Send + Sync {
    /// The most bytes held since the last call (or since the allocator began),
    /// restarting the mark at the bytes held now.
    fn take_peak(&self) -> u64;
}

/// Per-phase device peaks over nested phases: every reading is folded into
/// every open phase, so a phase's peak covers its children's.
#[derive(Default)]
struct DeviceScopes {
    probe: Option<Arc<dyn DevicePeak>>,
    open: Vec<u64>,
}

impl DeviceScopes {
    fn fold(&mut self) {
        if let Some(p) = &self.probe {
            let v = p.take_peak();
            self.open.iter_mut().for_each(|o| *o = (*o).max(v));
        }
    }

    fn open(&mut self) {
        self.fold();
        self.open.push(0);
    }

    /// The closing phase's peak, if a device is attached.
    fn close(&mut self) -> Option<u64> {
        self.fold();
        let v = self.open.pop().unwrap_or(0);
        self.probe.as_ref().map(|_| v)
    }
}

/// The render's phase recorder.
pub struct Recorder {
    emitter: Emitter,
    mem: Mutex<PeakTracker>,
    device: Mutex<DeviceScopes>,
}

impl Recorder {
    /// A recorder writing through `emitter`.
    pub fn new(emitter: Emitter) -> Self {
        Recorder {
            emitter,
            mem: Mutex::new(PeakTracker::new()),
            device: Mutex::new(DeviceScopes::default()),
        }
    }

    /// From now on every close also carries `peak_device_bytes` from `probe`
    /// (phases already open get the peak since the probe began).
    pub fn attach_device(&self, probe: Arc<dyn DevicePeak>) {
        self.device.lock().unwrap_or_else(|p| p.into_inner()).probe = Some(probe);
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
        self.device.lock().unwrap_or_else(|p| p.into_inner()).open();
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
        let dev = self
            .device
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .close();
        if let Some(d) = dev {
            attrs.insert(attr::PEAK_DEVICE_BYTES.into(), Value::from(d));
        }
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

    /// A fake allocator: bytes held now and the high-water mark.
    #[derive(Default)]
    struct FakeDev(Mutex<(u64, u64)>);
    impl FakeDev {
        fn set(&self, now: u64) {
            let mut g = self.0.lock().unwrap();
            g.0 = now;
            g.1 = g.1.max(now);
        }
    }
    impl DevicePeak for FakeDev {
        fn take_peak(&self) -> u64 {
            let mut g = self.0.lock().unwrap();
            let p = g.1;
            g.1 = g.0;
            p
        }
    }

    #[test]
    fn device_peaks_cover_children_and_start_when_attached() {
        let buf = Buf::default();
        let r = Recorder::new(Emitter::to_writer(Box::new(buf.clone()), false));
        r.phase("text", Attrs::new()).finish(Attrs::new());
        let dev = Arc::new(FakeDev::default());
        let load = r.phase("load.dit", Attrs::new());
        dev.set(100);
        r.attach_device(dev.clone());
        dev.set(700); // staging spike
        dev.set(400);
        load.finish(Attrs::new());
        let den = r.phase("denoise", Attrs::new());
        let s1 = r.phase("denoise.step", Attrs::new());
        dev.set(900);
        dev.set(450);
        s1.finish(Attrs::new());
        r.phase("denoise.step", Attrs::new()).finish(Attrs::new());
        dev.set(0);
        den.finish(Attrs::new());
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let peaks: Vec<(String, Option<u64>)> = text
            .lines()
            .map(|l| parse_marker_line(l).unwrap())
            .filter(|m| matches!(m, Marker::Close { .. }))
            .map(|m| {
                (
                    m.name().unwrap().to_string(),
                    m.attrs()
                        .get(attr::PEAK_DEVICE_BYTES)
                        .and_then(|v| v.as_u64()),
                )
            })
            .collect();
        assert_eq!(
            peaks,
            [
                ("text".to_string(), None),
                ("load.dit".to_string(), Some(700)),
                ("denoise.step".to_string(), Some(900)),
                ("denoise.step".to_string(), Some(450)),
                ("denoise".to_string(), Some(900)),
            ]
        );
    }
}
