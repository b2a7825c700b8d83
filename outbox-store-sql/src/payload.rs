//! The payload column: its type per `store.payload_type`, read back from the catalog, and the
//! error when the configuration and the table disagree.

use outboxkit_core::{Error, ErrorKind, PayloadType, Result};

/// How one database stores each payload type, and converts a table from one to another.
pub trait PayloadColumn {
    /// The column types `migrate` creates, in [`PayloadType::ALL`] order: `jsonb`, `text`,
    /// `bytea`...
    const COLUMN_TYPES: [&'static str; 3];

    /// The column type `migrate` creates for `payload_type`.
    fn column_type(payload_type: PayloadType) -> &'static str {
        Self::COLUMN_TYPES[payload_type as usize]
    }

    /// The statement converting the payload column of `table` (quoted) from `from` to `to`.
    fn convert(table: &str, from: PayloadType, to: PayloadType) -> String;
}

/// The table's payload type read from the catalog (`column` is the column's type as the
/// catalog names it); errors when the column is missing or of a type the relay cannot read.
pub fn from_catalog(
    table: &dyn std::fmt::Display,
    column: Option<&str>,
    of: impl Fn(&str) -> Option<PayloadType>,
) -> Result<PayloadType> {
    let Some(column) = column else {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "table {table} does not exist or has no payload column: run {}",
                outboxkit_core::command::line("migrate")
            ),
        ));
    };
    of(column).ok_or_else(|| {
        Error::new(
            ErrorKind::Schema,
            format!(
                "the payload column of {table} is of type {column}, which the relay cannot \
                 read: make it a json, text or binary column (see store.payload_type in \
                 docs/CONFIGURATION.md)"
            ),
        )
    })
}

/// `Ok` unless `store.payload_type` is set to another type than the table's; the error names
/// the key, both types and the statement converting the table.
pub fn check_configured<C: PayloadColumn>(
    configured: Option<PayloadType>,
    actual: PayloadType,
    table: &dyn std::fmt::Display,
    quoted_table: &str,
) -> Result<()> {
    match configured {
        Some(wanted) if wanted != actual => Err(Error::config(format!(
            "store.payload_type = \"{wanted}\", but table {table} holds `{actual}` payloads \
                 (column payload {}). Convert the table, with the relays stopped: `{}`; or \
                 remove store.payload_type to use the table's type",
            C::column_type(actual),
            C::convert(quoted_table, actual, wanted)
        ))),
        _ => Ok(()),
    }
}
