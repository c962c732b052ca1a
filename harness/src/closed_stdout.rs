//! A closed standard output (`harness ls | head -n1`): the reader is gone, so
//! the command stops at once, quietly, with exit [`crate::exit::INTERNAL`]
//! (the output could not be written), never a panic and a backtrace.
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe fails with `EPIPE`:
//! `println!` then panics ("failed printing to stdout"), and a `write!` with
//! `?` returns the error. [`install`] turns the first into a quiet exit, and
//! [`is_closed_output`] lets `main` recognise the second.

use std::io::ErrorKind;

/// The panic text `std` gives a `print!`/`println!` (or `eprint!`) whose
/// write failed.
const PRINT_FAILED: [&str; 2] = ["failed printing to stdout", "failed printing to stderr"];

/// Whether a panic payload is a print to a closed pipe.
fn is_broken_print(msg: &str) -> bool {
    PRINT_FAILED.iter().any(|p| msg.starts_with(p)) && msg.contains("Broken pipe")
}

/// Install a panic hook that ends the process with exit
/// [`crate::exit::INTERNAL`] and no output when a print found its pipe
/// closed; every other panic is reported as before.
pub fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_broken_print(msg) {
            std::process::exit(i32::from(crate::exit::INTERNAL));
        }
        previous(info);
    }));
}

/// Whether `err` (or a cause of it) is a write to a closed pipe: `main` then
/// exits [`crate::exit::INTERNAL`] without a message (there is no reader).
pub fn is_closed_output(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_print_to_a_closed_pipe_is_quiet() {
        assert!(is_broken_print(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!is_broken_print(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!is_broken_print("index out of bounds"));
        let e = anyhow::Error::from(std::io::Error::from(ErrorKind::BrokenPipe))
            .context("writing to standard output");
        assert!(is_closed_output(&e));
        assert!(!is_closed_output(&anyhow::anyhow!("disk full")));
    }
}
