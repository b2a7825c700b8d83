//! A TCP proxy that can cut the network between a client (a relay, a sink) and its server (a
//! database, a broker) without closing anything: [`Blackhole::partition`] stops forwarding in
//! both directions (connections stay open and hang, new ones are accepted and wait), as a
//! partition or a hung server does; [`Blackhole::heal`] lets everything through again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// See the module's documentation. Its task ends with the test's runtime.
#[derive(Debug, Clone)]
pub struct Blackhole {
    port: u16,
    cut: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl Blackhole {
    /// Listen on a free port of 127.0.0.1 and forward to `upstream` (`host:port`).
    pub async fn to(upstream: String) -> Self {
        Self::on("127.0.0.1", upstream).await
    }

    /// Listen on a free port of `address` (a [`crate::Link`]'s machine end, say) and forward
    /// to `upstream` (`host:port`).
    pub async fn on(address: &str, upstream: String) -> Self {
        let listener = TcpListener::bind((address, 0))
            .await
            .unwrap_or_else(|e| panic!("binding a proxy port on {address}: {e}"));
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (accept_cut, count) = (cut.clone(), accepted.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                let (cut, upstream) = (accept_cut.clone(), upstream.clone());
                tokio::spawn(async move {
                    while cut.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let Ok(server) = TcpStream::connect(upstream.as_str()).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::spawn(pump(client_read, server_write, cut.clone()));
                    tokio::spawn(pump(server_read, client_write, cut));
                });
            }
        });
        Self {
            port,
            cut,
            accepted,
        }
    }

    /// The port relays connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Stop forwarding: both directions hang.
    pub fn partition(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    /// Forward again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }
}

/// Copy `from` to `to`, holding the bytes while the network is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while cut.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while cut.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
