//! The marker channel reader: every raw line into the journal (`Marker` records,
//! the line kept verbatim and stamped with its receive time), parsed only to follow
//! the open phases live, count malformed lines, and force the journal to disk at
//! every phase boundary.

use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use evidence::clock::monotonic_ns;
use evidence::journal::{Record, SharedJournal};
use evidence::marker::{parse_marker_line, Marker};

use crate::progress::SharedPrinter;

/// Longest marker line journaled, in bytes; the rest of a longer line is skipped a
/// buffer at a time, never held (the line is malformed anyway: the protocol
/// allows 64 KiB), and the count of dropped bytes is said on stderr.
pub const MAX_KEPT_LINE: usize = 1 << 20;
/// Malformed lines reported on stderr one by one; later ones are only counted.
pub const MALFORMED_REPORTED: u64 = 5;

/// What the markers said so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    /// Phases open now, outermost first.
    pub open: Vec<String>,
    /// Lines received.
    pub lines: u64,
    /// Lines that are not protocol events.
    pub malformed: u64,
    /// `frames_written` from the engine's last info marker.
    pub frames_written: Option<u64>,
    /// Engine name and version from `hello`.
    pub engine: Option<(String, String)>,
    /// Top-level phases in open order: name, open and close (None while open)
    /// CLOCK_MONOTONIC ns from the markers; what contention is judged over per phase.
    pub top_level: Vec<(String, u64, Option<u64>)>,
    /// Where in `open` the open top-level phase sits, if one is open: a child left
    /// open by an out-of-order close stays in `open` without hiding later phases.
    top_open: Option<usize>,
}

impl Live {
    /// Follow one parsed event.
    pub fn apply(&mut self, m: &Marker) {
        match m {
            Marker::Hello {
                engine, version, ..
            } => self.engine = Some((engine.clone(), version.clone())),
            Marker::Open { name, t_ns, .. } => {
                if self.top_open.is_none() {
                    self.top_level.push((name.clone(), *t_ns, None));
                    self.top_open = Some(self.open.len());
                }
                self.open.push(name.clone());
            }
            Marker::Close { name, t_ns, .. } => {
                if let Some(i) = self.open.iter().rposition(|n| n == name) {
                    self.open.remove(i);
                    match self.top_open {
                        Some(top) if i == top => {
                            if let Some(last) = self.top_level.last_mut() {
                                last.2 = Some(*t_ns);
                            }
                            self.top_open = None;
                        }
                        Some(top) if i < top => self.top_open = Some(top - 1),
                        _ => {}
                    }
                }
            }
            Marker::Tick { .. } => {}
            Marker::Info { attrs, .. } => {
                if let Some(n) = attrs.get("frames_written").and_then(|v| v.as_u64()) {
                    self.frames_written = Some(n);
                }
            }
        }
    }
}

/// Read the channel until every writer has closed it, on a new thread.
pub fn read_markers<R: Read + Send + 'static>(
    input: R,
    journal: SharedJournal,
    live: Arc<Mutex<Live>>,
    printer: Option<SharedPrinter>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("markers".into())
        .spawn(move || pump(input, &journal, &live, printer.as_ref()))
}

/// Consume the rest of the current line (through its newline, or to the end of
/// the input) a buffer at a time; the bytes consumed, newline excluded.
fn skip_line<R: BufRead>(reader: &mut R) -> u64 {
    let mut dropped = 0u64;
    loop {
        let (used, done) = match reader.fill_buf() {
            Ok([]) => return dropped,
            Ok(chunk) => match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return dropped,
        };
        reader.consume(used);
        dropped += used as u64 - u64::from(done);
        if done {
            return dropped;
        }
    }
}

fn pump<R: Read>(
    input: R,
    journal: &SharedJournal,
    live: &Mutex<Live>,
    printer: Option<&SharedPrinter>,
) {
    let mut reader = BufReader::new(input);
    let mut buf = Vec::new();
    let mut journal_failed = false;
    loop {
        buf.clear();
        match reader
            .by_ref()
            .take(MAX_KEPT_LINE as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let recv_ns = monotonic_ns();
        let complete = buf.last() == Some(&b'\n');
        if !complete && buf.len() >= MAX_KEPT_LINE {
            // Skip the rest of an over-long line without holding it.
            let dropped = skip_line(&mut reader);
            eprintln!(
                "harness: a marker line over {MAX_KEPT_LINE} bytes: its first {MAX_KEPT_LINE} bytes are kept, {dropped} more dropped"
            );
        }
        let valid_utf8 = std::str::from_utf8(&buf).is_ok();
        let text = String::from_utf8_lossy(&buf);
        let line = text.trim_end_matches('\n');
        let parsed = if valid_utf8 {
            parse_marker_line(line)
        } else {
            Err(evidence::marker::MarkerError::Json("not UTF-8".into()))
        };
        if let Err(e) = journal.append(&Record::Marker {
            recv_ns,
            line: line.to_string(),
        }) {
            if !journal_failed {
                journal_failed = true;
                eprintln!("harness: journal append failed for a marker: {e}");
            }
        }
        let mut boundary = false;
        {
            let mut l = live.lock().unwrap_or_else(|p| p.into_inner());
            l.lines += 1;
            match &parsed {
                Ok(m) => {
                    boundary = matches!(m, Marker::Open { .. } | Marker::Close { .. });
                    l.apply(m);
                }
                Err(e) => {
                    l.malformed += 1;
                    if l.malformed <= MALFORMED_REPORTED {
                        let shown: String = line.chars().take(120).collect();
                        eprintln!(
                            "harness: malformed marker line #{} kept verbatim ({e}): {shown}",
                            l.malformed
                        );
                    } else if l.malformed == MALFORMED_REPORTED + 1 {
                        eprintln!("harness: further malformed marker lines are only counted");
                    }
                }
            }
        }
        if let (Some(p), Ok(m)) = (printer, &parsed) {
            let _ = p
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .marker(m, recv_ns);
        }
        if boundary {
            if let Err(e) = journal.sync_now() {
                if !journal_failed {
                    journal_failed = true;
                    eprintln!("harness: journal sync failed at a phase boundary: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evidence::attrs;

    #[test]
    fn top_level_phases_are_kept_with_their_marker_times() {
        let mut l = Live::default();
        let at = |t: u64, open: bool, n: &str| {
            if open {
                Marker::Open {
                    t_ns: t,
                    name: n.into(),
                    attrs: Default::default(),
                }
            } else {
                Marker::Close {
                    t_ns: t,
                    name: n.into(),
                    attrs: Default::default(),
                }
            }
        };
        for m in [
            at(1, true, "load"),
            at(2, true, "load.dit"),
            at(3, false, "load.dit"),
            at(4, false, "load"),
            at(5, true, "denoise"),
            at(6, true, "denoise.step"),
            at(7, false, "denoise"), // out of order: the step stays open
            at(8, false, "denoise.step"),
            at(10, true, "decode"),
            at(11, true, "decode.chunk"),
            at(12, false, "decode"), // out of order: the chunk never closes
            at(13, true, "artifacts"),
            at(14, true, "artifacts"), // the same name nested
            at(15, false, "artifacts"),
            at(16, false, "artifacts"),
            at(17, true, "tail"),
        ] {
            l.apply(&m);
        }
        assert_eq!(
            l.top_level,
            [
                ("load".to_string(), 1, Some(4)),
                ("denoise".to_string(), 5, Some(7)),
                ("decode".to_string(), 10, Some(12)),
                ("artifacts".to_string(), 13, Some(16)),
                ("tail".to_string(), 17, None),
            ]
        );
        assert_eq!(l.open, ["decode.chunk", "tail"]);
    }

    #[test]
    fn live_state_follows_nesting_by_name() {
        let mut l = Live::default();
        let open = |n: &str| Marker::Open {
            t_ns: 1,
            name: n.into(),
            attrs: Default::default(),
        };
        let close = |n: &str| Marker::Close {
            t_ns: 2,
            name: n.into(),
            attrs: Default::default(),
        };
        l.apply(&open("denoise"));
        l.apply(&open("denoise.step"));
        assert_eq!(l.open, ["denoise", "denoise.step"]);
        l.apply(&close("denoise.step"));
        l.apply(&open("denoise.step"));
        assert_eq!(l.open, ["denoise", "denoise.step"]);
        // A close of a phase that is not innermost removes that phase.
        l.apply(&close("denoise"));
        assert_eq!(l.open, ["denoise.step"]);
        l.apply(&close("never-opened"));
        assert_eq!(l.open, ["denoise.step"]);
        l.apply(&Marker::Info {
            t_ns: 3,
            attrs: attrs! {"frames_written" => 9},
        });
        assert_eq!(l.frames_written, Some(9));
    }

    #[test]
    fn the_rest_of_an_over_long_line_is_skipped_in_bounded_memory() {
        let mut input = std::io::BufReader::with_capacity(
            64,
            std::io::Cursor::new(
                b"abcdefghij"
                    .repeat(100)
                    .into_iter()
                    .chain(*b"\nnext\n")
                    .collect::<Vec<u8>>(),
            ),
        );
        assert_eq!(skip_line(&mut input), 1000);
        let mut rest = String::new();
        input.read_line(&mut rest).unwrap();
        assert_eq!(rest, "next\n");
        assert_eq!(skip_line(&mut input), 0);
    }
}
