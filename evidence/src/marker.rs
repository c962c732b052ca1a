//! The marker protocol (version 1), specified in `specs/markers.md`.
//!
//! An engine learns from the environment variable [`MARKER_FD_ENV`] the number of an
//! inherited, write-only file descriptor and writes one JSON object per line to it.
//! Every object carries `ev` (its kind) and `t_ns` (CLOCK_MONOTONIC nanoseconds, see
//! [`crate::clock`]). Phases nest by time: a `close` ends the innermost open phase of
//! the same name. Ticks mark instants inside a phase (one per DiT forward).
//!
//! The same events are rendered for people on stderr by [`Emitter`]:
//! `+name` when a phase opens, `-name <seconds>s <peak bytes>` when it closes, and
//! `~name k/N #forward last=<seconds>s` per tick.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use crate::clock::monotonic_ns;

/// Environment variable naming the marker channel's file descriptor (decimal).
pub const MARKER_FD_ENV: &str = "HARNESS_MARKER_FD";
/// Environment variable naming the directory the engine writes its frames into.
pub const FRAMES_DIR_ENV: &str = "HARNESS_FRAMES_DIR";
/// The protocol version this crate speaks; engines announce theirs in `hello`.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest marker line accepted, in bytes (without the newline).
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Longest phase or tick name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Free-form attributes of a marker; well-known keys are in [`attr`].
pub type Attrs = BTreeMap<String, Value>;

/// Well-known attribute keys and their units.
pub mod attr {
    /// Denoise step of a tick or `denoise.step`, 1-based (integer).
    pub const STEP: &str = "step";
    /// Number of denoise steps in the run (integer).
    pub const STEPS: &str = "steps";
    /// Global DiT forward index of a tick, 1-based (integer).
    pub const FORWARD: &str = "forward";
    /// Seconds since the previous DiT forward's tick (float); absent on the first.
    pub const LAST_S: &str = "last_s";
    /// Device time of the enclosed work in milliseconds, from device events (float).
    pub const DEVICE_MS: &str = "device_ms";
    /// Bytes copied host-to-device inside a phase (integer).
    pub const BYTES_STAGED: &str = "bytes_staged";
    /// Peak resident host bytes of the engine inside the phase (integer).
    pub const PEAK_HOST_BYTES: &str = "peak_host_bytes";
    /// Peak device bytes allocated by the engine inside the phase (integer).
    pub const PEAK_DEVICE_BYTES: &str = "peak_device_bytes";
    /// Chunk index of `decode.video.chunk`, 0-based (integer).
    pub const CHUNK: &str = "chunk";
    /// Set to `true` on a close written while unwinding from an error.
    pub const ABORTED: &str = "aborted";
}

/// One event of the marker protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Marker {
    /// First line an engine writes: its name, version and protocol version.
    Hello {
        /// CLOCK_MONOTONIC nanoseconds.
        t_ns: u64,
        /// Protocol version the engine speaks (this crate: [`PROTOCOL_VERSION`]).
        protocol: u32,
        /// Engine name.
        engine: String,
        /// Engine version string.
        version: String,
        /// Anything else the engine wants recorded (levers in effect, device...).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        attrs: Attrs,
    },
    /// A phase opens.
    Open {
        /// CLOCK_MONOTONIC nanoseconds.
        t_ns: u64,
        /// Phase name, dotted (`denoise.step`).
        name: String,
        /// Attributes known at open.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        attrs: Attrs,
    },
    /// The innermost open phase of this name closes.
    Close {
        /// CLOCK_MONOTONIC nanoseconds.
        t_ns: u64,
        /// Phase name; must match the innermost open phase.
        name: String,
        /// Attributes known at close (peaks, device time, bytes staged).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        attrs: Attrs,
    },
    /// An instant inside the current phase (one per DiT forward).
    Tick {
        /// CLOCK_MONOTONIC nanoseconds.
        t_ns: u64,
        /// Tick name (`dit.forward`).
        name: String,
        /// Step, steps, forward index, `last_s`, device time.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        attrs: Attrs,
    },
    /// Facts about the run that are not a phase (weights files, frames written).
    Info {
        /// CLOCK_MONOTONIC nanoseconds.
        t_ns: u64,
        /// The facts.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        attrs: Attrs,
    },
}

impl Marker {
    /// The event's CLOCK_MONOTONIC timestamp in nanoseconds.
    pub fn t_ns(&self) -> u64 {
        match self {
            Marker::Hello { t_ns, .. }
            | Marker::Open { t_ns, .. }
            | Marker::Close { t_ns, .. }
            | Marker::Tick { t_ns, .. }
            | Marker::Info { t_ns, .. } => *t_ns,
        }
    }

    /// The phase or tick name, when the event has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Marker::Open { name, .. } | Marker::Close { name, .. } | Marker::Tick { name, .. } => {
                Some(name)
            }
            _ => None,
        }
    }

    /// The event's attributes.
    pub fn attrs(&self) -> &Attrs {
        match self {
            Marker::Hello { attrs, .. }
            | Marker::Open { attrs, .. }
            | Marker::Close { attrs, .. }
            | Marker::Tick { attrs, .. }
            | Marker::Info { attrs, .. } => attrs,
        }
    }

    /// The protocol line for this event, without the trailing newline.
    pub fn to_line(&self) -> String {
        // Serialising a tree of strings, integers, floats and maps cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// Why a marker line was not accepted. The line itself is kept by the caller.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MarkerError {
    /// The line is empty or only whitespace.
    #[error("empty marker line")]
    Empty,
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("marker line of {0} bytes exceeds the {MAX_LINE_BYTES}-byte limit")]
    TooLong(usize),
    /// The line is not a JSON object of a known kind with the required fields.
    #[error("marker line is not a protocol object: {0}")]
    Json(String),
    /// A phase or tick name is empty, too long, or has characters outside
    /// `[A-Za-z0-9_.-]`.
    #[error("marker name {0:?} is not 1-{MAX_NAME_BYTES} characters of [A-Za-z0-9_.-]")]
    BadName(String),
}

/// Whether `name` is a valid phase or tick name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// Parse one protocol line (without its newline).
///
/// Promise: never panics; any input that is not a valid event is an error, so the
/// caller can keep the line verbatim and count it.
pub fn parse_marker_line(line: &str) -> Result<Marker, MarkerError> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Err(MarkerError::Empty);
    }
    if line.len() > MAX_LINE_BYTES {
        return Err(MarkerError::TooLong(line.len()));
    }
    let marker: Marker =
        serde_json::from_str(trimmed).map_err(|e| MarkerError::Json(e.to_string()))?;
    if let Some(name) = marker.name() {
        if !valid_name(name) {
            return Err(MarkerError::BadName(name.to_string()));
        }
    }
    Ok(marker)
}

/// Render an attribute that counts bytes the way people read them.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// The human line for a close: `-name <seconds>s <peaks>`.
fn human_close(name: &str, seconds: Option<f64>, attrs: &Attrs) -> String {
    let mut s = format!("-{name}");
    match seconds {
        Some(sec) => s.push_str(&format!(" {sec:.3}s")),
        None => s.push_str(" ?s"),
    }
    let host = attrs.get(attr::PEAK_HOST_BYTES).and_then(Value::as_u64);
    let dev = attrs.get(attr::PEAK_DEVICE_BYTES).and_then(Value::as_u64);
    if let Some(h) = host {
        s.push_str(&format!(" host_peak={}", human_bytes(h)));
    }
    if let Some(d) = dev {
        s.push_str(&format!(" device_peak={}", human_bytes(d)));
    }
    if let Some(ms) = attrs.get(attr::DEVICE_MS).and_then(Value::as_f64) {
        s.push_str(&format!(" device={ms:.1}ms"));
    }
    if attrs.get(attr::ABORTED).and_then(Value::as_bool) == Some(true) {
        s.push_str(" ABORTED");
    }
    s
}

/// The human line for a tick: `~name k/N #forward last=<seconds>s`.
pub fn human_tick(name: &str, attrs: &Attrs) -> String {
    let mut s = format!("~{name}");
    if let (Some(k), Some(n)) = (
        attrs.get(attr::STEP).and_then(Value::as_u64),
        attrs.get(attr::STEPS).and_then(Value::as_u64),
    ) {
        s.push_str(&format!(" {k}/{n}"));
    }
    if let Some(f) = attrs.get(attr::FORWARD).and_then(Value::as_u64) {
        s.push_str(&format!(" #{f}"));
    }
    match attrs.get(attr::LAST_S).and_then(Value::as_f64) {
        Some(l) => s.push_str(&format!(" last={l:.3}s")),
        None => s.push_str(" last=-"),
    }
    if let Some(ms) = attrs.get(attr::DEVICE_MS).and_then(Value::as_f64) {
        s.push_str(&format!(" device={ms:.1}ms"));
    }
    s
}

/// Where an [`Emitter`] writes protocol lines.
enum Channel {
    /// No harness: only the human rendering is written.
    None,
    /// An inherited descriptor or any writer (tests).
    Writer(Box<dyn Write + Send>),
}

struct EmitterState {
    channel: Channel,
    /// Open phases: name and open time, innermost last.
    stack: Vec<(String, u64)>,
    /// Set after the first failed write; further protocol writes are skipped.
    broken: bool,
}

/// Writes marker events for an engine: protocol lines to the harness channel and
/// the human rendering to stderr.
///
/// Promise: a failing channel (the harness died) never fails or stops the engine;
/// the first failure is reported once on stderr and later events go to stderr only.
pub struct Emitter {
    state: Mutex<EmitterState>,
    human: bool,
}

/// The environment named a marker descriptor that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{MARKER_FD_ENV}={value:?}: expected the number of an open file descriptor >= 3 ({why})")]
pub struct MarkerFdError {
    /// The variable's value.
    pub value: String,
    /// What was wrong with it.
    pub why: String,
}

impl Emitter {
    /// The emitter for this process: the channel named by [`MARKER_FD_ENV`] when set,
    /// human lines on stderr always.
    pub fn from_env() -> Result<Self, MarkerFdError> {
        let channel = match std::env::var(MARKER_FD_ENV) {
            Err(_) => Channel::None,
            Ok(value) => {
                let fd: i32 = value.trim().parse().map_err(|_| MarkerFdError {
                    value: value.clone(),
                    why: "not a decimal number".into(),
                })?;
                if fd < 3 {
                    return Err(MarkerFdError {
                        value,
                        why: "0, 1 and 2 are the standard streams".into(),
                    });
                }
                // SAFETY: fcntl(F_GETFD) only queries the descriptor.
                let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
                if flags < 0 {
                    return Err(MarkerFdError {
                        value,
                        why: "descriptor is not open".into(),
                    });
                }
                // Keep it from leaking into the engine's own children.
                // SAFETY: setting FD_CLOEXEC on a descriptor we verified is open.
                unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
                use std::os::fd::FromRawFd;
                // SAFETY: the harness handed this descriptor to us for our sole use;
                // we take ownership of it exactly once.
                let file = unsafe { File::from_raw_fd(fd) };
                Channel::Writer(Box::new(file))
            }
        };
        Ok(Self::with_channel(channel, true))
    }

    /// An emitter that only renders human lines on stderr.
    pub fn human_only() -> Self {
        Self::with_channel(Channel::None, true)
    }

    /// An emitter writing protocol lines to `writer`; `human` enables stderr lines.
    pub fn to_writer(writer: Box<dyn Write + Send>, human: bool) -> Self {
        Self::with_channel(Channel::Writer(writer), human)
    }

    fn with_channel(channel: Channel, human: bool) -> Self {
        Emitter {
            state: Mutex::new(EmitterState {
                channel,
                stack: Vec::new(),
                broken: false,
            }),
            human,
        }
    }

    /// Whether a harness channel is attached.
    pub fn has_channel(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        matches!(st.channel, Channel::Writer(_)) && !st.broken
    }

    fn write(&self, st: &mut EmitterState, marker: &Marker, human: Option<String>) {
        if let Channel::Writer(w) = &mut st.channel {
            if !st.broken {
                let mut line = marker.to_line();
                line.push('\n');
                // One write per line: a pipe write up to PIPE_BUF is atomic.
                if let Err(e) = w.write_all(line.as_bytes()).and_then(|_| w.flush()) {
                    st.broken = true;
                    eprintln!("marker channel failed ({e}); continuing with stderr only");
                }
            }
        }
        if self.human {
            if let Some(h) = human {
                eprintln!("{h}");
            }
        }
    }

    /// Announce the engine (first event of a run).
    pub fn hello(&self, engine: &str, version: &str, attrs: Attrs) {
        let m = Marker::Hello {
            t_ns: monotonic_ns(),
            protocol: PROTOCOL_VERSION,
            engine: engine.to_string(),
            version: version.to_string(),
            attrs,
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let h = format!("engine {engine} {version} (marker protocol {PROTOCOL_VERSION})");
        self.write(&mut st, &m, Some(h));
    }

    /// Open phase `name`.
    pub fn open(&self, name: &str, attrs: Attrs) {
        let t = monotonic_ns();
        let m = Marker::Open {
            t_ns: t,
            name: name.to_string(),
            attrs,
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stack.push((name.to_string(), t));
        self.write(&mut st, &m, Some(format!("+{name}")));
    }

    /// Close the innermost open phase `name`, with its closing attributes.
    pub fn close(&self, name: &str, attrs: Attrs) {
        let t = monotonic_ns();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let opened = st
            .stack
            .iter()
            .rposition(|(n, _)| n == name)
            .map(|i| st.stack.remove(i).1);
        let secs = opened.map(|o| (t.saturating_sub(o)) as f64 / 1e9);
        let h = human_close(name, secs, &attrs);
        let m = Marker::Close {
            t_ns: t,
            name: name.to_string(),
            attrs,
        };
        self.write(&mut st, &m, Some(h));
    }

    /// Emit a tick `name` (one per DiT forward).
    pub fn tick(&self, name: &str, attrs: Attrs) {
        let h = human_tick(name, &attrs);
        let m = Marker::Tick {
            t_ns: monotonic_ns(),
            name: name.to_string(),
            attrs,
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.write(&mut st, &m, Some(h));
    }

    /// Record facts that are not a phase.
    pub fn info(&self, attrs: Attrs) {
        let m = Marker::Info {
            t_ns: monotonic_ns(),
            attrs,
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.write(&mut st, &m, None);
    }

    /// Open `name` and return a guard; [`PhaseGuard::finish`] closes it with
    /// attributes, and dropping an unfinished guard closes it marked aborted.
    pub fn phase<'a>(&'a self, name: &str) -> PhaseGuard<'a> {
        self.open(name, Attrs::new());
        PhaseGuard {
            emitter: self,
            name: name.to_string(),
            done: false,
        }
    }
}

/// An open phase; see [`Emitter::phase`].
pub struct PhaseGuard<'a> {
    emitter: &'a Emitter,
    name: String,
    done: bool,
}

impl PhaseGuard<'_> {
    /// Close the phase with `attrs`.
    pub fn finish(mut self, attrs: Attrs) {
        self.done = true;
        self.emitter.close(&self.name, attrs);
    }
}

impl Drop for PhaseGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut a = Attrs::new();
            a.insert(attr::ABORTED.into(), Value::Bool(true));
            self.emitter.close(&self.name, a);
        }
    }
}

/// Build [`Attrs`] from `key => value` pairs: `attrs! { "step" => 3, "steps" => 30 }`.
#[macro_export]
macro_rules! attrs {
    () => { $crate::marker::Attrs::new() };
    ($($k:expr => $v:expr),+ $(,)?) => {{
        let mut a = $crate::marker::Attrs::new();
        $( a.insert(String::from($k), serde_json::json!($v)); )+
        a
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn emitted_lines_parse_back_in_order_with_nesting() {
        let buf = Buf::default();
        let e = Emitter::to_writer(Box::new(buf.clone()), false);
        e.hello("engine", "0.1.0", Attrs::new());
        e.open("denoise", Attrs::new());
        e.open("denoise.step", attrs! {"step" => 1, "steps" => 2});
        e.tick(
            "dit.forward",
            attrs! {"step" => 1, "steps" => 2, "forward" => 1},
        );
        e.close("denoise.step", Attrs::new());
        {
            let g = e.phase("denoise.step");
            g.finish(attrs! {"device_ms" => 1.5});
        }
        e.close("denoise", attrs! {"peak_host_bytes" => 1024u64});
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let ms: Vec<Marker> = text
            .lines()
            .map(|l| parse_marker_line(l).unwrap())
            .collect();
        assert_eq!(ms.len(), 8);
        assert!(matches!(&ms[0], Marker::Hello { protocol: 1, .. }));
        let names: Vec<_> = ms.iter().map(|m| m.name().unwrap_or("-")).collect();
        assert_eq!(
            names,
            [
                "-",
                "denoise",
                "denoise.step",
                "dit.forward",
                "denoise.step",
                "denoise.step",
                "denoise.step",
                "denoise"
            ]
        );
        assert!(ms.windows(2).all(|w| w[0].t_ns() <= w[1].t_ns()));
        assert_eq!(ms[6].attrs()["device_ms"], serde_json::json!(1.5));
    }

    #[test]
    fn dropped_guard_closes_marked_aborted() {
        let buf = Buf::default();
        let e = Emitter::to_writer(Box::new(buf.clone()), false);
        drop(e.phase("load.dit"));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let last = parse_marker_line(text.lines().last().unwrap()).unwrap();
        assert_eq!(last.attrs()[attr::ABORTED], Value::Bool(true));
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        for bad in [
            "",
            "   ",
            "not json",
            "{}",
            r#"{"ev":"open"}"#,
            r#"{"ev":"open","t_ns":-1,"name":"x"}"#,
            r#"{"ev":"warp","t_ns":1}"#,
            r#"{"ev":"open","t_ns":1,"name":"bad name"}"#,
            r#"{"ev":"open","t_ns":1,"name":""}"#,
            "[1,2,3]",
            "\u{0}\u{1}",
        ] {
            assert!(parse_marker_line(bad).is_err(), "accepted {bad:?}");
        }
        let long = format!(
            r#"{{"ev":"info","t_ns":1,"attrs":{{"x":"{}"}}}}"#,
            "a".repeat(MAX_LINE_BYTES)
        );
        assert!(matches!(
            parse_marker_line(&long),
            Err(MarkerError::TooLong(_))
        ));
    }

    #[test]
    fn human_lines_follow_the_protocol_rendering() {
        let a = attrs! {"step" => 3, "steps" => 30, "forward" => 6, "last_s" => 0.0841};
        assert_eq!(
            human_tick("dit.forward", &a),
            "~dit.forward 3/30 #6 last=0.084s"
        );
        let c = human_close(
            "load.dit",
            Some(1.5),
            &attrs! {"peak_host_bytes" => 2048u64},
        );
        assert_eq!(c, "-load.dit 1.500s host_peak=2.00 KiB");
    }

    #[test]
    fn bad_marker_fd_is_a_clear_error() {
        // Only this test touches the variable in this process.
        std::env::set_var(MARKER_FD_ENV, "abc");
        let e = Emitter::from_env().err().unwrap().to_string();
        assert!(e.contains("HARNESS_MARKER_FD") && e.contains("abc"), "{e}");
        std::env::set_var(MARKER_FD_ENV, "987");
        let e = Emitter::from_env().err().unwrap().to_string();
        assert!(e.contains("not open"), "{e}");
        std::env::remove_var(MARKER_FD_ENV);
        assert!(!Emitter::from_env().unwrap().has_channel());
    }
}
