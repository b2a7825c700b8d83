//! Graceful shutdown: a trigger and the listeners cloned from its channel.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Fires the shutdown of every [`Shutdown`] cloned from its channel.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownTrigger {
    /// Ask every relay listening on this channel to stop gracefully.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }
}

/// The listening side of a shutdown channel.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// A new channel: the trigger and its first listener.
    pub fn channel() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger { tx: Arc::new(tx) }, Shutdown { rx })
    }

    /// Whether shutdown was asked for.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Wait until shutdown is asked for (forever if the trigger is dropped unused).
    pub async fn wait(&mut self) {
        if self.rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Sleep for `duration`, or less if shutdown is asked for meanwhile.
    pub(super) async fn pause(&mut self, duration: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = self.wait() => {}
        }
    }
}
