//! What the one-shot commands (`status`, `dead`, `migrate`) print on standard output.
//!
//! A reader that stops early (`outbox-relay status | head -3`) closes the pipe: the lines
//! after that are dropped and the command still does all its work and exits with its own code.
//! `println!` would panic there instead, in the middle of a `migrate` of several pipelines.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output cannot be written: nothing more is tried.
static GONE: AtomicBool = AtomicBool::new(false);

/// `println!` for the commands' output: see the module.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Write one line to standard output, unless it is gone.
pub(crate) fn line(args: std::fmt::Arguments<'_>) {
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = io::stdout().lock();
    let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) else {
        return;
    };
    GONE.store(true, Ordering::Relaxed);
    // A closed pipe is the reader's choice; any other failure (a full disk) is said once.
    if e.kind() != io::ErrorKind::BrokenPipe {
        eprintln!("warning: cannot write the output any more: {e}");
    }
}

/// `at` to the second, as every command prints a time (UTC, said by the caller):
/// `2026-12-05 13:32:12`.
pub(crate) fn utc_second(at: chrono::DateTime<chrono::Utc>) -> impl std::fmt::Display {
    at.format("%Y-%m-%d %H:%M:%S")
}
