//! What the one-shot commands (`status`, `dead`, `migrate`) print on standard output.
//!
//! A reader that stops early (`outbox-relay status | head -3`) closes the pipe: the lines
//! after that are dropped and the command still does all its work and exits with its own code.
//! `println!` would panic there instead, in the middle of a `migrate` of several pipelines.

use std::borrow::Cow;
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

/// `text` fit for a line of a terminal: each control character written as its escape (`\n`,
/// `\t`, `\u{1b}`). The commands print what writers, brokers and operators wrote (aggregates,
/// event types, errors, payloads, a pause's reason) through it, so that no value can break a
/// line, fake one, or move the cursor and recolour the operator's terminal.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c.is_control() {
                true => c.escape_default().to_string(),
                false => c.to_string(),
            })
            .collect(),
    )
}

/// `at` to the second, as every command prints a time (UTC, said by the caller):
/// `2026-12-05 13:32:12`.
pub(crate) fn utc_second(at: chrono::DateTime<chrono::Utc>) -> impl std::fmt::Display {
    at.format("%Y-%m-%d %H:%M:%S")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_kept() {
        assert!(matches!(
            printable("order/42 caf\u{e9} \u{2713}"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("a\nb\r\tc\u{1b}[2J\u{7f}\u{9b}d"),
            r"a\nb\r\tc\u{1b}[2J\u{7f}\u{9b}d"
        );
    }
}
