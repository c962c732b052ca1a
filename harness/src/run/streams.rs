//! The engine's stdout and stderr: captured line by line into the journal
//! (`Output` records, stamped on the marker clock) and echoed to the harness's
//! stderr, so the engine's `+phase` lines stay visible while the run is alive.

use std::io::{BufRead, BufReader, Read, Write};
use std::thread::JoinHandle;

use evidence::clock::monotonic_ns;
use evidence::journal::{Record, SharedJournal, Stream};

use crate::progress::SharedPrinter;

/// Longest line kept whole, in bytes; longer ones are split at this length.
pub const MAX_OUTPUT_LINE: usize = 64 * 1024;

/// Read lines from `input` until end-of-file on a new thread; returns the line count.
pub fn capture<R: Read + Send + 'static>(
    input: R,
    stream: Stream,
    journal: SharedJournal,
    echo: bool,
    printer: Option<SharedPrinter>,
) -> std::io::Result<JoinHandle<u64>> {
    let name = match stream {
        Stream::Stdout => "engine-stdout",
        Stream::Stderr => "engine-stderr",
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || pump(input, stream, &journal, echo, printer.as_ref()))
}

fn pump<R: Read>(
    input: R,
    stream: Stream,
    journal: &SharedJournal,
    echo: bool,
    printer: Option<&SharedPrinter>,
) -> u64 {
    let mut reader = BufReader::new(input);
    let mut buf = Vec::new();
    let mut lines = 0u64;
    let mut journal_failed = false;
    let mut echo_ok = echo;
    loop {
        buf.clear();
        match reader
            .by_ref()
            .take(MAX_OUTPUT_LINE as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let t_ns = monotonic_ns();
        let text = String::from_utf8_lossy(&buf);
        let line = text.trim_end_matches('\n').trim_end_matches('\r');
        lines += 1;
        if echo_ok {
            // The live status line comes off the screen first (and is redrawn by
            // the next event), holding its lock so no status write lands mid-line.
            let mut status = printer.map(|p| p.lock().unwrap_or_else(|e| e.into_inner()));
            if let Some(s) = status.as_mut() {
                let _ = s.clear();
            }
            // A closed terminal must not stop the capture (H4).
            let mut err = std::io::stderr().lock();
            echo_ok = writeln!(err, "{line}").is_ok();
        }
        let r = Record::Output {
            t_ns,
            stream,
            line: line.to_string(),
        };
        if let Err(e) = journal.append(&r) {
            if !journal_failed {
                journal_failed = true;
                eprintln!("harness: journal append failed for engine output: {e}");
            }
        }
    }
    lines
}
