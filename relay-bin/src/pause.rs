//! `outbox-relay pause` and `resume`: stop every relay of a table from publishing, for as long
//! as an operator needs (a consumer being fixed, a broker migration), without stopping the
//! relays, and let them go on where they stopped.

use outboxkit_core::{Pause, Paused, Store};

/// `outbox-relay pause`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// Why, for whoever reads `status` (and the relays' log) meanwhile.
    #[arg(long)]
    pub reason: Option<String>,
    /// Who pauses it; by default the user and host running the command (`alice@ops-1`).
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
}

impl PauseArgs {
    /// `--by`, else `$USER@<host>` (`LOGNAME` or `USERNAME` when `USER` is not set; `unknown`
    /// when none is, the host name from `HOSTNAME` or `/etc/hostname` when there is one).
    pub fn by(&self) -> String {
        if let Some(by) = self.by.as_deref().filter(|b| !b.trim().is_empty()) {
            return by.trim().to_owned();
        }
        let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let user = ["USER", "LOGNAME", "USERNAME"]
            .into_iter()
            .find_map(variable)
            .unwrap_or_else(|| "unknown".to_owned());
        match outboxkit_core::engine::host_name() {
            Some(host) => format!("{}@{host}", user.trim()),
            None => user.trim().to_owned(),
        }
    }
}

/// Pause `store`'s table: the verb and the rest of its line (`paused`, `<store> (since ...)`).
pub async fn pause(
    store: &dyn Store,
    args: &PauseArgs,
) -> outboxkit_core::Result<(String, String)> {
    let reason = args.reason.as_deref().unwrap_or_default().trim();
    let paused = store.pause(&args.by(), reason).await?;
    let verb = match paused {
        Paused::Now(_) => "paused",
        Paused::Already(_) => "already paused",
    };
    let rest = format!("{} ({})", store.describe(), who(paused.pause()));
    Ok((verb.to_owned(), rest))
}

/// Lift the pause of `store`'s table: the verb and the rest of its line.
pub async fn resume(store: &dyn Store) -> outboxkit_core::Result<(String, String)> {
    Ok(match store.resume().await? {
        Some(pause) => (
            "resumed".to_owned(),
            format!("{} (paused {})", store.describe(), who(&pause)),
        ),
        None => ("was not paused:".to_owned(), store.describe()),
    })
}

/// `since 2026-12-06 23:40:01 UTC by alice@ops-1: consumer fix`, as `pause`, `resume` and
/// `status` say it.
pub fn who(pause: &Pause) -> String {
    let reason = match pause.reason.as_str() {
        "" => String::new(),
        reason => format!(": {}", crate::out::printable(reason)),
    };
    format!(
        "since {} UTC by {}{reason}",
        crate::out::utc_second(pause.since),
        crate::out::printable(&pause.by)
    )
}
