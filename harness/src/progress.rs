//! Live progress of a render for the person watching `harness run`: the open phase
//! (innermost, with its parents), step k/N, elapsed time, an ETA of the denoise
//! loop from its observed step time, GPU utilization and the engine's RSS.
//!
//! [`Progress`] folds marker events and sampler rows into that state and renders it
//! as one line. [`Printer`] puts it on a stream in one of two ways:
//! * a terminal ([`Style::Redraw`]): one status line redrawn in place (`\r`, clear
//!   to end of line), at most every [`REDRAW_EVERY_NS`];
//! * anything else ([`Style::Lines`]): one plain line per marker event (open,
//!   close, tick, info), never a control character, so logs and CI stay readable.
//!
//! Driving it from `harness run`: make one `Printer::stderr(run_start_ns)`, share it
//! between the marker reader and the sampler (e.g. `Arc<Mutex<_>>`), call
//! [`Printer::marker`] with every parsed marker and its receive time,
//! [`Printer::sample`] with every sampler row, [`Printer::clear`] before the harness
//! writes a message of its own to stderr, and [`Printer::finish`] when the engine
//! has exited. Malformed marker lines are not shown (the journal keeps them).
//!
//! ETA: the remaining steps of the denoise loop times the observed step time,
//! both read from the `denoise.step` markers' own timestamps: `denoise.step`
//! opens with `step` and `steps`; when it closes, `step` steps are done and
//! `steps - step` remain. The step time is the mean interval between the step
//! closes seen so far in this loop (after the first close: the first step's
//! open-to-close), so it excludes nothing but what precedes step 1's open.
//! The ETA is not read from the `dit.forward` ticks' `last_s`: that is the
//! host's interval between two ticks, and the CUDA arm reports a step's forwards
//! together once the step is done (bundle `c7b7689e5840`, rung 3: `last_s`
//! alternates 0.66 s and 0.00005 s), so remaining forwards x `last_s` read
//! `denoise ETA 0.0s` after every second tick. The ticks still give the line's
//! `forward f/F` (`denoise` opens with `forwards_per_step`; without it, one
//! forward per step seen so far in the ticks).

use std::io::Write;

use evidence::marker::{human_bytes, Marker};
use evidence::sample::Sample;

/// The shortest interval between two redraws of the status line, ns (4 per second).
pub const REDRAW_EVERY_NS: u64 = 250_000_000;

/// How progress is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// One status line redrawn in place (a terminal).
    Redraw,
    /// One plain line per marker event (a file, a pipe, CI).
    Lines,
    /// One plain `harness: status ...` line at most every [`HEARTBEAT_EVERY_NS`],
    /// from markers or samples: what `harness run` writes when stderr is not a
    /// terminal, where the engine's own `+phase` lines already give one line per
    /// event and the status adds GPU utilization, RSS and the ETA to the log.
    Heartbeat,
}

/// Interval of [`Style::Heartbeat`] lines, ns (10 s).
pub const HEARTBEAT_EVERY_NS: u64 = 10_000_000_000;

impl Style {
    /// [`Style::Redraw`] when standard error is a terminal, else [`Style::Lines`].
    pub fn for_stderr() -> Style {
        // SAFETY: isatty only reads the descriptor's state.
        if unsafe { libc::isatty(libc::STDERR_FILENO) } == 1 {
            Style::Redraw
        } else {
            Style::Lines
        }
    }
}

/// What is known about the render so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// CLOCK_MONOTONIC ns when the run started (elapsed counts from here).
    pub start_ns: u64,
    /// Open phases, outermost first.
    pub open: Vec<String>,
    /// The current step and the number of steps (from `denoise.step` or a tick).
    pub step: Option<(u64, u64)>,
    /// Forwards done (the last tick's `forward`).
    pub forward: Option<u64>,
    /// Forwards per step (from `denoise`'s open attributes).
    pub forwards_per_step: Option<u64>,
    /// The denoise loop's step timing so far (reset when `denoise` opens).
    pub steps_timed: StepTiming,
    /// The last sample's GPU utilization, percent.
    pub gpu_util_pct: Option<f64>,
    /// The last sample's RSS of the engine's process tree, bytes.
    pub rss_bytes: Option<f64>,
}

/// When the current denoise loop's steps opened and closed (marker `t_ns`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTiming {
    /// The open `denoise.step`: its `step` and open time.
    pub open: Option<(u64, u64)>,
    /// The first closed step: its `step`, open and close times.
    pub first: Option<(u64, u64, u64)>,
    /// The last closed step: its `step` and close time.
    pub last: Option<(u64, u64)>,
}

impl StepTiming {
    fn on_open(&mut self, step: Option<u64>, t_ns: u64) {
        self.open = step.map(|k| (k, t_ns));
    }

    fn on_close(&mut self, t_ns: u64) {
        let Some((k, opened)) = self.open.take() else {
            return;
        };
        if self.first.is_none() {
            self.first = Some((k, opened, t_ns));
        }
        self.last = Some((k, t_ns));
    }

    /// Steps done (the `step` of the last closed `denoise.step`).
    pub fn done(&self) -> Option<u64> {
        self.last.map(|(k, _)| k)
    }

    /// Seconds per step: the mean interval between the first and the last step
    /// close, or the first step's open-to-close while only one has closed.
    pub fn step_s(&self) -> Option<f64> {
        let (k1, open1, close1) = self.first?;
        let (k, close) = self.last?;
        if k > k1 && close >= close1 {
            Some((close - close1) as f64 / 1e9 / (k - k1) as f64)
        } else {
            Some(close1.saturating_sub(open1) as f64 / 1e9)
        }
    }
}

fn attr_u64(m: &Marker, k: &str) -> Option<u64> {
    m.attrs().get(k).and_then(|v| v.as_u64())
}

/// `1h02m03s`, `2m05s`, `7.3s`.
pub fn human_duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let t = s.round() as u64;
    let (h, m, sec) = (t / 3600, (t % 3600) / 60, t % 60);
    if h > 0 {
        format!("{h}h{m:02}m{sec:02}s")
    } else {
        format!("{m}m{sec:02}s")
    }
}

impl Progress {
    /// A render that started at `start_ns`.
    pub fn new(start_ns: u64) -> Progress {
        Progress {
            start_ns,
            ..Default::default()
        }
    }

    /// Fold in one marker event.
    pub fn on_marker(&mut self, m: &Marker) {
        match m {
            Marker::Open { name, t_ns, .. } => {
                if name == "denoise" {
                    self.forwards_per_step = attr_u64(m, "forwards_per_step");
                    self.steps_timed = StepTiming::default();
                }
                if name == "denoise.step" {
                    self.steps_timed.on_open(attr_u64(m, "step"), *t_ns);
                }
                if let (Some(k), Some(n)) = (attr_u64(m, "step"), attr_u64(m, "steps")) {
                    self.step = Some((k, n));
                }
                self.open.push(name.clone());
            }
            Marker::Close { name, t_ns, .. } => {
                if name == "denoise.step" {
                    self.steps_timed.on_close(*t_ns);
                }
                // The innermost open phase of that name closes, and only it (the
                // protocol's rule, as `evidence::phases::build_tree` applies it); a
                // close with no open phase of that name changes nothing.
                if let Some(i) = self.open.iter().rposition(|n| n == name) {
                    self.open.remove(i);
                }
            }
            Marker::Tick { .. } => {
                if let (Some(k), Some(n)) = (attr_u64(m, "step"), attr_u64(m, "steps")) {
                    self.step = Some((k, n));
                }
                if let Some(f) = attr_u64(m, "forward") {
                    self.forward = Some(f);
                }
            }
            Marker::Hello { .. } | Marker::Info { .. } => {}
        }
    }

    /// Fold in one sampler row (GPU utilization and RSS; a missing reading keeps
    /// the previous one).
    pub fn on_sample(&mut self, s: &Sample) {
        if let Some(u) = s.get("gpu_util_pct") {
            self.gpu_util_pct = Some(u);
        }
        if let Some(r) = s.get("rss_bytes") {
            self.rss_bytes = Some(r);
        }
    }

    /// Forwards in the whole denoise loop, when known.
    pub fn forwards_total(&self) -> Option<u64> {
        let (k, n) = self.step?;
        let per = self.forwards_per_step.or_else(|| {
            // One forward per step seen so far, at least.
            self.forward.map(|f| f.div_ceil(k.max(1)).max(1))
        })?;
        Some(n * per)
    }

    /// Seconds left in the denoise loop, as of the last step close: the steps
    /// not yet done x the observed step time ([`StepTiming::step_s`]). `None`
    /// before the first step closes and outside the loop.
    pub fn eta_s(&self) -> Option<f64> {
        if !self.open.iter().any(|n| n == "denoise") {
            return None;
        }
        let (_, steps) = self.step?;
        let left = steps.checked_sub(self.steps_timed.done()?)?;
        Some(left as f64 * self.steps_timed.step_s()?)
    }

    /// The status line at `now_ns` (no newline, no control characters).
    pub fn line(&self, now_ns: u64) -> String {
        let mut parts = Vec::new();
        parts.push(if self.open.is_empty() {
            "(no phase open)".to_string()
        } else {
            self.open.join(" > ")
        });
        if let Some((k, n)) = self.step {
            let mut s = format!("step {k}/{n}");
            if let (Some(f), Some(t)) = (self.forward, self.forwards_total()) {
                s.push_str(&format!(" (forward {f}/{t})"));
            }
            parts.push(s);
        }
        parts.push(format!(
            "elapsed {}",
            human_duration(now_ns.saturating_sub(self.start_ns) as f64 / 1e9)
        ));
        if let Some(eta) = self.eta_s() {
            parts.push(format!("denoise ETA {}", human_duration(eta)));
        }
        parts.push(match self.gpu_util_pct {
            Some(u) => format!("GPU {u:.0}%"),
            None => "GPU -".into(),
        });
        parts.push(match self.rss_bytes {
            Some(r) => format!("RSS {}", human_bytes(r.max(0.0) as u64)),
            None => "RSS -".into(),
        });
        parts.join(" · ")
    }
}

/// Writes [`Progress`] to a stream in a [`Style`].
#[derive(Debug)]
pub struct Printer<W: Write> {
    out: W,
    style: Style,
    /// The state being shown.
    pub progress: Progress,
    last_draw_ns: Option<u64>,
    drawn: bool,
}

impl<W: Write> Printer<W> {
    /// A printer for a render that started at `start_ns`.
    pub fn new(out: W, style: Style, start_ns: u64) -> Self {
        Printer {
            out,
            style,
            progress: Progress::new(start_ns),
            last_draw_ns: None,
            drawn: false,
        }
    }

    /// Take the status line off the screen ([`Style::Redraw`] only: carriage return
    /// and clear to end of line), so a message written next starts at column 0 on
    /// a clean line; the next marker or sample draws the status again. Nothing is
    /// written in [`Style::Lines`] or when nothing is on screen.
    pub fn clear(&mut self) -> std::io::Result<()> {
        if self.style == Style::Redraw && self.drawn {
            write!(self.out, "\r\x1b[2K")?;
            self.drawn = false;
            self.last_draw_ns = None;
            self.out.flush()?;
        }
        Ok(())
    }

    /// A marker arrived at `now_ns`: in [`Style::Lines`] print one line for it,
    /// in [`Style::Redraw`] redraw the status line (phase changes at once).
    pub fn marker(&mut self, m: &Marker, now_ns: u64) -> std::io::Result<()> {
        self.progress.on_marker(m);
        match self.style {
            Style::Lines => {
                let what = match m {
                    Marker::Open { name, .. } => format!("open {name}"),
                    Marker::Close { name, .. } => format!("close {name}"),
                    Marker::Tick { name, .. } => format!("tick {name}"),
                    Marker::Hello {
                        engine, version, ..
                    } => format!(
                        "hello {} {}",
                        crate::escape::terminal(engine),
                        crate::escape::terminal(version)
                    ),
                    Marker::Info { .. } => "info".to_string(),
                };
                writeln!(
                    self.out,
                    "[{}] {what} | {}",
                    human_duration(now_ns.saturating_sub(self.progress.start_ns) as f64 / 1e9),
                    self.progress.line(now_ns)
                )?;
                self.out.flush()
            }
            Style::Redraw => {
                let force = !matches!(m, Marker::Tick { .. });
                self.redraw(now_ns, force)
            }
            Style::Heartbeat => self.heartbeat(now_ns),
        }
    }

    fn heartbeat(&mut self, now_ns: u64) -> std::io::Result<()> {
        if self
            .last_draw_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < HEARTBEAT_EVERY_NS)
        {
            return Ok(());
        }
        self.last_draw_ns = Some(now_ns);
        writeln!(self.out, "harness: status {}", self.progress.line(now_ns))?;
        self.out.flush()
    }

    /// A sample arrived at `now_ns`: fold it in; in [`Style::Redraw`] redraw at
    /// most every [`REDRAW_EVERY_NS`]. [`Style::Lines`] prints nothing for samples.
    pub fn sample(&mut self, s: &Sample, now_ns: u64) -> std::io::Result<()> {
        self.progress.on_sample(s);
        match self.style {
            Style::Lines => Ok(()),
            Style::Redraw => self.redraw(now_ns, false),
            Style::Heartbeat => self.heartbeat(now_ns),
        }
    }

    fn redraw(&mut self, now_ns: u64, force: bool) -> std::io::Result<()> {
        if !force
            && self
                .last_draw_ns
                .is_some_and(|t| now_ns.saturating_sub(t) < REDRAW_EVERY_NS)
        {
            return Ok(());
        }
        self.last_draw_ns = Some(now_ns);
        self.drawn = true;
        write!(self.out, "\r\x1b[2K{}", self.progress.line(now_ns))?;
        self.out.flush()
    }

    /// End the status line (a newline after a redrawn line), so what follows starts
    /// on a fresh line.
    pub fn finish(&mut self) -> std::io::Result<()> {
        if self.style == Style::Redraw && self.drawn {
            writeln!(self.out)?;
        }
        self.out.flush()
    }

    /// The stream, back.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// The printer `harness run` shares between the marker reader, the output
/// echo threads and the sampler (each takes the lock for one write).
pub type SharedPrinter = std::sync::Arc<std::sync::Mutex<Printer<std::io::Stderr>>>;

impl Printer<std::io::Stderr> {
    /// A printer on standard error for a render that started at `start_ns`
    /// (CLOCK_MONOTONIC ns), in the style [`Style::for_stderr`] picks.
    pub fn stderr(start_ns: u64) -> Self {
        Printer::new(std::io::stderr(), Style::for_stderr(), start_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evidence::marker::Attrs;
    use serde_json::json;

    fn attrs(kv: &[(&str, serde_json::Value)]) -> Attrs {
        kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }
    fn open(t: u64, n: &str, a: Attrs) -> Marker {
        Marker::Open {
            t_ns: t,
            name: n.into(),
            attrs: a,
        }
    }
    fn close(t: u64, n: &str) -> Marker {
        Marker::Close {
            t_ns: t,
            name: n.into(),
            attrs: Attrs::new(),
        }
    }
    fn tick(t: u64, step: u64, forward: u64, last: Option<f64>) -> Marker {
        let mut a = attrs(&[
            ("step", json!(step)),
            ("steps", json!(30)),
            ("forward", json!(forward)),
        ]);
        if let Some(l) = last {
            a.insert("last_s".into(), json!(l));
        }
        Marker::Tick {
            t_ns: t,
            name: "dit.forward".into(),
            attrs: a,
        }
    }

    #[test]
    fn eta_is_remaining_steps_times_the_observed_step_time() {
        let s = 1_000_000_000u64;
        let mut p = Progress::new(0);
        p.on_marker(&open(
            0,
            "denoise",
            attrs(&[("steps", json!(30)), ("forwards_per_step", json!(2))]),
        ));
        let step = |k: u64| attrs(&[("step", json!(k)), ("steps", json!(30))]);
        p.on_marker(&open(0, "denoise.step", step(1)));
        assert_eq!(p.eta_s(), None, "no step time before the first step closes");
        p.on_marker(&close(3 * s, "denoise.step"));
        // One step closed: its own open-to-close, 3 s, for the 29 left.
        assert_eq!(p.eta_s(), Some(29.0 * 3.0));
        p.on_marker(&open(3 * s, "denoise.step", step(2)));
        p.on_marker(&close(5 * s, "denoise.step"));
        p.on_marker(&open(5 * s, "denoise.step", step(3)));
        p.on_marker(&tick(6 * s, 3, 5, Some(1.25)));
        // Two closed: the interval between the closes, 2 s, for the 28 left.
        assert_eq!(p.forwards_total(), Some(60));
        assert_eq!(p.eta_s(), Some(28.0 * 2.0));
        let mut sample = Sample::empty(2 * s);
        sample.set("gpu_util_pct", Some(97.4));
        sample.set("rss_bytes", Some(3.0 * (1u64 << 30) as f64));
        p.on_sample(&sample);
        assert_eq!(
            p.line(65 * s),
            "denoise > denoise.step · step 3/30 (forward 5/60) · elapsed 1m05s · denoise ETA 56.0s · GPU 97% · RSS 3.00 GiB"
        );
        // A sample without readings keeps the last ones.
        p.on_sample(&Sample::empty(3 * s));
        assert!(
            p.line(65 * s).ends_with("GPU 97% · RSS 3.00 GiB"),
            "{}",
            p.line(65 * s)
        );
        // Past the loop there is no ETA.
        p.on_marker(&close(70 * s, "denoise.step"));
        p.on_marker(&close(70 * s, "denoise"));
        assert_eq!(p.eta_s(), None);
        assert!(p.line(70 * s).starts_with("(no phase open)"));
        // A second loop starts its timing afresh.
        p.on_marker(&open(80 * s, "denoise", Attrs::new()));
        p.on_marker(&open(80 * s, "denoise.step", step(1)));
        assert_eq!(p.eta_s(), None);
    }

    /// A 30-step, two-forwards-per-step denoise scripted as the CUDA arm writes
    /// it (bundle `c7b7689e5840`): both `dit.forward` ticks of a step arrive
    /// together when the step is done, the first with `last_s` ~ the step time,
    /// the second with `last_s` ~ 50 us. Step times are 58 s / 30 with a seeded
    /// jitter of at most +-5%. After every step close and every tick, the shown
    /// ETA must be the steps left x the mean step time observed so far (to float
    /// rounding: 1e-9 relative), and within 11% of the time the script really
    /// has left: the observed mean and the mean of the steps still to come each
    /// lie within +-5% of the nominal step, so their ratio lies within
    /// [0.95/1.05, 1.05/0.95], i.e. within 10.6% of 1.
    ///
    /// Red under the old rule (remaining forwards x the last tick's `last_s`,
    /// i.e. `eta_s` reading `last_s` again): from step 1's second tick on, it
    /// says ~0.003 s, the `denoise ETA 0.0s` seen live at step 4/30. Red too if
    /// the steps left counted the open step as done (`steps - k`, k the open
    /// step's number): during the last step the ETA reads 0 against ~1.9 s.
    #[test]
    fn a_scripted_cuda_denoise_shows_the_remaining_steps_times_the_step_time() {
        use rand::{Rng, SeedableRng};
        let steps = 30u64;
        let nominal_ns = 58_000_000_000u64 / steps;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
        let dur: Vec<u64> = (0..steps)
            .map(|_| (nominal_ns as f64 * rng.random_range(0.95..1.05)) as u64)
            .collect();
        let t0 = 5_000_000_000u64;
        let mut pr = Printer::new(Vec::new(), Style::Lines, 0);
        let mut t = t0;
        pr.marker(
            &open(
                t,
                "denoise",
                attrs(&[("steps", json!(steps)), ("forwards_per_step", json!(2))]),
            ),
            t,
        )
        .unwrap();
        let mut closes = Vec::new();
        for k in 1..=steps {
            let a = attrs(&[("step", json!(k)), ("steps", json!(steps))]);
            pr.marker(&open(t, "denoise.step", a), t).unwrap();
            let end = t + dur[(k - 1) as usize];
            let first_last = (k > 1).then(|| (end - t) as f64 / 1e9);
            pr.marker(&tick(end, k, 2 * k - 1, first_last), end)
                .unwrap();
            pr.marker(&tick(end + 50_000, k, 2 * k, Some(5e-5)), end + 50_000)
                .unwrap();
            let shown_before_close = pr.progress.eta_s();
            t = end + 60_000;
            pr.marker(&close(t, "denoise.step"), t).unwrap();
            closes.push(t);
            let eta = pr.progress.eta_s().expect("an ETA once a step has closed");
            // Observed: the mean interval between closes (step 1: its own span).
            let observed_s = if k == 1 {
                (t - t0) as f64 / 1e9
            } else {
                (t - closes[0]) as f64 / 1e9 / (k - 1) as f64
            };
            let left = steps - k;
            let want = left as f64 * observed_s;
            assert!(
                (eta - want).abs() <= 1e-9 * want.max(1.0),
                "step {k}: ETA {eta} s, remaining steps x observed step time {want} s"
            );
            let really_left: u64 = dur[k as usize..].iter().sum();
            let really_left = really_left as f64 / 1e9;
            assert!(
                (eta - really_left).abs() <= 0.11 * really_left,
                "step {k}: ETA {eta} s against {really_left} s really left"
            );
            if k > 1 {
                // Between two closes the ETA stays as of the last close.
                assert!(shown_before_close.is_some_and(|e| e > 0.0), "step {k}");
            }
        }
        let text = String::from_utf8(pr.into_inner()).unwrap();
        // The line at step 4's second tick, as a person reads it.
        let line = text
            .lines()
            .find(|l| l.contains("tick dit.forward") && l.contains("forward 8/60"))
            .expect("step 4's second tick");
        let eta_text = line
            .split(" · ")
            .find_map(|p| p.strip_prefix("denoise ETA "))
            .expect("an ETA on the line");
        // Three steps done: 27 left at the mean of the intervals between closes.
        let observed_s = (closes[2] - closes[0]) as f64 / 1e9 / 2.0;
        assert_eq!(eta_text, human_duration(27.0 * observed_s), "{line}");
        assert_ne!(eta_text, "0.0s", "{line}");
    }

    #[test]
    fn without_forwards_per_step_the_ticks_say_how_many() {
        let mut p = Progress::new(0);
        p.on_marker(&open(0, "denoise", Attrs::new()));
        p.on_marker(&tick(1, 1, 1, None));
        p.on_marker(&tick(2, 1, 2, Some(0.5)));
        p.on_marker(&tick(3, 2, 3, Some(0.5)));
        // 3 forwards by step 2: two per step.
        assert_eq!(p.forwards_total(), Some(60));
        assert_eq!(p.eta_s(), None, "no step has closed");
    }

    #[test]
    fn heartbeat_style_writes_one_status_line_per_interval_from_markers_or_samples() {
        let s = 1_000_000_000u64;
        let mut pr = Printer::new(Vec::new(), Style::Heartbeat, 0);
        pr.marker(&open(s, "load.dit", Attrs::new()), s).unwrap();
        // 9.9 s of samples and a close: inside the interval, nothing more.
        for k in 1..100 {
            pr.sample(&Sample::empty(s + k * s / 10), s + k * s / 10)
                .unwrap();
        }
        pr.marker(&close(s + 99 * s / 10, "load.dit"), s + 99 * s / 10)
            .unwrap();
        // The first event at or after 10 s writes the next line.
        pr.sample(&Sample::empty(11 * s), 11 * s).unwrap();
        pr.finish().unwrap();
        let text = String::from_utf8(pr.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("harness: status load.dit"), "{text}");
        assert!(
            lines[1].starts_with("harness: status (no phase open)"),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text}");
    }

    #[test]
    fn plain_style_writes_one_clean_line_per_event_and_nothing_per_sample() {
        let s = 1_000_000_000u64;
        let mut pr = Printer::new(Vec::new(), Style::Lines, 0);
        pr.marker(&open(s, "load.dit", Attrs::new()), s).unwrap();
        for k in 0..50 {
            pr.sample(&Sample::empty(s + k), s + k).unwrap();
        }
        pr.marker(&close(2 * s, "load.dit"), 2 * s).unwrap();
        pr.finish().unwrap();
        let text = String::from_utf8(pr.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("[1.0s] open load.dit | load.dit · elapsed 1.0s"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("[2.0s] close load.dit | (no phase open)"),
            "{}",
            lines[1]
        );
        assert!(!text.contains('\r') && !text.contains('\x1b'));
    }

    #[test]
    fn terminal_style_redraws_in_place_and_throttles_samples() {
        let mut pr = Printer::new(Vec::new(), Style::Redraw, 0);
        pr.marker(&open(0, "denoise", Attrs::new()), 0).unwrap();
        // 100 samples within 100 ms: throttled to none (the open just drew).
        for k in 0..100u64 {
            pr.sample(&Sample::empty(k * 1_000_000), k * 1_000_000)
                .unwrap();
        }
        // One sample past the interval draws again.
        pr.sample(&Sample::empty(REDRAW_EVERY_NS), REDRAW_EVERY_NS)
            .unwrap();
        pr.finish().unwrap();
        let text = String::from_utf8(pr.into_inner()).unwrap();
        assert_eq!(text.matches("\r\x1b[2K").count(), 2, "{text:?}");
        assert!(text.ends_with('\n'));
        assert_eq!(text.matches('\n').count(), 1);
    }

    #[test]
    fn open_phases_follow_the_same_rule_as_the_sealed_phase_tree() {
        use rand::{Rng, SeedableRng};
        // Random open/close streams (closes of outer phases while inner ones are
        // open, closes with no match): what the status shows as open must be what
        // the bundle's phase tree will record as never closed, in open order.
        let names = [
            "load",
            "denoise",
            "denoise.step",
            "decode",
            "decode.video.chunk",
        ];
        for seed in 0..200u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut p = Progress::new(0);
            let mut markers = Vec::new();
            for t in 0..rng.random_range(1..40u64) {
                let n = names[rng.random_range(0..names.len())];
                let m = if rng.random_bool(0.55) {
                    open(t, n, Attrs::new())
                } else {
                    close(t, n)
                };
                p.on_marker(&m);
                markers.push(m);
            }
            let tree = evidence::phases::build_tree(&markers, 1_000);
            let still_open: Vec<String> = tree
                .phases
                .iter()
                .filter(|ph| ph.close_ns.is_none())
                .map(|ph| ph.name.clone())
                .collect();
            assert_eq!(p.open, still_open, "seed {seed}: {markers:?}");
        }
        // The case that tells the rules apart: the outer phase closes first.
        let mut p = Progress::new(0);
        p.on_marker(&open(0, "a", Attrs::new()));
        p.on_marker(&open(1, "b", Attrs::new()));
        p.on_marker(&close(2, "a"));
        assert_eq!(p.open, vec!["b".to_string()]);
        p.on_marker(&close(3, "zzz"));
        assert_eq!(p.open, vec!["b".to_string()]);
    }

    #[test]
    fn protocol_lines_as_the_engine_writes_them_drive_the_status() {
        // The attributes of engine/src/pipeline.rs (guidance on: two forwards per
        // step), as text on the marker channel, parsed as `harness run` parses them.
        let s = 1_000_000_000u64;
        let lines = [
            r#"{"ev":"hello","t_ns":1000000000,"protocol":1,"engine":"engine","version":"0.1.0"}"#,
            r#"{"ev":"open","t_ns":2000000000,"name":"load.dit"}"#,
            r#"{"ev":"close","t_ns":9000000000,"name":"load.dit","attrs":{"peak_host_bytes":123}}"#,
            r#"{"ev":"open","t_ns":9000000000,"name":"denoise","attrs":{"steps":4,"tokens":18,"forwards_per_step":2}}"#,
            r#"{"ev":"open","t_ns":9000000000,"name":"denoise.step","attrs":{"step":1,"steps":4}}"#,
            r#"{"ev":"tick","t_ns":11000000000,"name":"dit.forward","attrs":{"step":1,"steps":4,"forward":1}}"#,
            r#"{"ev":"tick","t_ns":13500000000,"name":"dit.forward","attrs":{"step":1,"steps":4,"forward":2,"last_s":2.5}}"#,
            r#"{"ev":"close","t_ns":13600000000,"name":"denoise.step","attrs":{"sigma":1.0}}"#,
            r#"{"ev":"open","t_ns":13600000000,"name":"denoise.step","attrs":{"step":2,"steps":4}}"#,
            r#"{"ev":"tick","t_ns":15600000000,"name":"dit.forward","attrs":{"step":2,"steps":4,"forward":3,"last_s":2.0}}"#,
        ];
        let mut pr = Printer::new(Vec::new(), Style::Lines, s);
        for l in lines {
            let m = evidence::marker::parse_marker_line(l).unwrap();
            let t = m.t_ns();
            pr.marker(&m, t).unwrap();
        }
        let mut sample = Sample::empty(16 * s);
        sample.set("gpu_util_pct", Some(88.6));
        sample.set("rss_bytes", Some(1.5 * (1u64 << 30) as f64));
        pr.sample(&sample, 16 * s).unwrap();
        // Step 1 took 9.0 s to 13.6 s; 3 of 4 steps left: 13.8 s.
        assert!(pr.progress.eta_s().is_some_and(|e| (e - 13.8).abs() < 1e-9));
        assert_eq!(
            pr.progress.line(16 * s),
            "denoise > denoise.step · step 2/4 (forward 3/8) · elapsed 15.0s · denoise ETA 13.8s · GPU 89% · RSS 1.50 GiB"
        );
        let text = String::from_utf8(pr.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10, "{text}");
        assert_eq!(
            lines[0],
            "[0.0s] hello engine 0.1.0 | (no phase open) · elapsed 0.0s · GPU - · RSS -"
        );
        assert!(lines[6].starts_with("[12.5s] tick dit.forward | denoise > denoise.step · step 1/4 (forward 2/8) · elapsed 12.5s · GPU"), "{}", lines[6]);
        assert!(lines[7].contains("· denoise ETA 13.8s ·"), "{}", lines[7]);
    }

    #[test]
    fn clear_takes_the_status_off_the_line_and_the_next_sample_redraws() {
        let mut pr = Printer::new(Vec::new(), Style::Redraw, 0);
        pr.clear().unwrap(); // nothing on screen yet: nothing written
        pr.marker(&open(0, "denoise", Attrs::new()), 0).unwrap();
        pr.clear().unwrap();
        // Within the throttle interval, yet drawn: the line was cleared.
        pr.sample(&Sample::empty(1_000), 1_000).unwrap();
        pr.finish().unwrap();
        let text = String::from_utf8(pr.into_inner()).unwrap();
        assert_eq!(
            text,
            format!(
                "\r\x1b[2K{l}\r\x1b[2K\r\x1b[2K{l}\n",
                l = "denoise · elapsed 0.0s · GPU - · RSS -"
            )
        );
        // Plain lines never carry control characters, clear or not.
        let mut pr = Printer::new(Vec::new(), Style::Lines, 0);
        pr.marker(&open(0, "denoise", Attrs::new()), 0).unwrap();
        pr.clear().unwrap();
        pr.finish().unwrap();
        let text = String::from_utf8(pr.into_inner()).unwrap();
        assert_eq!(
            text,
            "[0.0s] open denoise | denoise · elapsed 0.0s · GPU - · RSS -\n"
        );
    }

    #[test]
    fn durations_read_as_a_person_would() {
        assert_eq!(human_duration(7.24), "7.2s");
        assert_eq!(human_duration(125.0), "2m05s");
        assert_eq!(human_duration(3723.0), "1h02m03s");
        assert_eq!(human_duration(f64::NAN), "-");
    }
}
