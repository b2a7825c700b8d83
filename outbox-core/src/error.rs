//! One error type for the whole relay, carrying its kind and whether it is retryable.
//!
//! Adapters classify driver errors once, in their `classify.rs`; the engine only ever looks at
//! [`Error::kind`] and [`Error::is_retryable`], never at messages.

use std::fmt;

/// Boxed source error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout the relay.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, independent of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Configuration is invalid (a key is missing, has the wrong type, or names an unknown kind).
    Config,
    /// The service could not be reached or the connection broke.
    Connection,
    /// The service answered but is temporarily unable to serve (overloaded, leader election, full queue).
    Unavailable,
    /// The call did not complete in time.
    Timeout,
    /// Credentials were refused or the caller may not do this.
    Unauthorized,
    /// The message is larger than the destination accepts.
    MessageTooLarge,
    /// The message is malformed for this destination (bad attribute, bad key...).
    InvalidMessage,
    /// The destination does not exist or nothing is bound to it.
    Unroutable,
    /// The outbox table or schema is missing or not as expected.
    Schema,
    /// The shard lock was lost: this relay must stop working on the shard.
    LeaseLost,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Whether errors of this kind are worth retrying by default.
    pub fn default_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Connection
                | ErrorKind::Unavailable
                | ErrorKind::Timeout
                | ErrorKind::LeaseLost
                | ErrorKind::Other
        )
    }

    /// Short, stable name used in logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Connection => "connection",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::MessageTooLarge => "message_too_large",
            ErrorKind::InvalidMessage => "invalid_message",
            ErrorKind::Unroutable => "unroutable",
            ErrorKind::Schema => "schema",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The relay's error: a kind, a retryability decided where the cause was understood, a message
/// written for people, and optionally the driver error underneath.
pub struct Error {
    kind: ErrorKind,
    retryable: bool,
    message: String,
    source: Option<BoxError>,
}

impl Error {
    /// A new error whose retryability follows its kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            retryable: kind.default_retryable(),
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for a configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Override: this error will pass if tried again.
    pub fn temporary(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// Override: trying again will never help.
    pub fn permanent(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The message, without the source chain.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message followed by every cause, on one line: what gets stored in `last_error`.
    pub fn full_message(&self) -> String {
        let mut out = self.message.clone();
        let mut next: Option<&(dyn std::error::Error + 'static)> =
            self.source.as_deref().map(|e| e as _);
        while let Some(err) = next {
            let text = err.to_string();
            if !text.is_empty() && !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            next = err.source();
        }
        out
    }

    /// Prefix the message with context ("publishing to stream orders").
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("retryable", &self.retryable)
            .field("message", &self.message)
            .field("source", &self.source.as_ref().map(|s| s.to_string()))
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full_message())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

impl Clone for Error {
    /// Clones keep kind, retryability and the full text; the source becomes text.
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            retryable: self.retryable,
            message: self.full_message(),
            source: None,
        }
    }
}

/// What a panic said (`panic!`'s text, from its payload), or that it said nothing readable.
/// The engine reports a caught panic with it, and the binary's panic hook logs it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic with no message")
}

/// A driver error and its causes on one line (`dispatch failure: io error: ...: Connection
/// refused`), each text once: what adapters quote in their messages.
pub fn source_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(err);
    while let Some(current) = next {
        let text = current.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = current.source();
    }
    out
}

/// The first error of type `T` in `err`'s chain of sources (`err` itself included).
pub fn find_source<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(current) = next {
        if let Some(found) = current.downcast_ref::<T>() {
            return Some(found);
        }
        next = current.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryability_follows_kind_unless_overridden() {
        assert!(Error::new(ErrorKind::Connection, "x").is_retryable());
        assert!(!Error::new(ErrorKind::MessageTooLarge, "x").is_retryable());
        assert!(!Error::new(ErrorKind::Connection, "x")
            .permanent()
            .is_retryable());
        assert!(Error::new(ErrorKind::Unroutable, "x")
            .temporary()
            .is_retryable());
    }

    #[test]
    fn full_message_includes_sources_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e =
            Error::new(ErrorKind::Connection, "connecting to redis 127.0.0.1:1").with_source(io);
        assert_eq!(e.full_message(), "connecting to redis 127.0.0.1:1: refused");
        assert_eq!(e.clone().full_message(), e.full_message());
    }
}
