//! `/metrics` (Prometheus text), `/healthz` and `/readyz` on a small HTTP/1.1 listener.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outboxkit_core::Shutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::supervisor::Board;

/// Install the Prometheus recorder for the `metrics` facade; returns the handle that renders.
pub fn install_recorder() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            outboxkit_core::metrics::LATENCY_BUCKETS,
        )
        .map_err(|e| format!("configuring metrics: {e}"))?
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    // Histograms are drained by upkeep; without the exporter's own HTTP listener we run it.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Bind `listen`; the error names the address.
pub async fn bind(listen: &str) -> Result<TcpListener, String> {
    let addr: SocketAddr = listen.parse().map_err(|e| {
        format!("server.listen: \"{listen}\" is not an address like 127.0.0.1:9464 ({e})")
    })?;
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("server.listen: cannot listen on {addr}: {e}"))
}

/// Serve until shutdown.
pub async fn serve(
    listener: TcpListener,
    relay: Board,
    metrics: PrometheusHandle,
    mut shutdown: Shutdown,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let relay = relay.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &relay, &metrics).await {
                        debug!(error = %e, "HTTP request failed");
                    }
                });
            }
            _ = shutdown.wait() => return,
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    relay: &Board,
    metrics: &PrometheusHandle,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    let read = async {
        loop {
            let n = stream.read(&mut buf[len..]).await?;
            len += n;
            if n == 0 || buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || len == buf.len() {
                return Ok::<_, std::io::Error>(());
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .is_err()
    {
        return Ok(());
    }
    let request = String::from_utf8_lossy(&buf[..len]);
    let mut parts = request.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("").split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        ("GET", "/healthz") if relay.is_alive() => ("200 OK", "text/plain", "ok\n".to_owned()),
        ("GET", "/healthz") => (
            "503 Service Unavailable",
            "text/plain",
            "stopped\n".to_owned(),
        ),
        ("GET", "/readyz") => match relay.readiness() {
            (true, body) => ("200 OK", "text/plain", body),
            (false, body) => ("503 Service Unavailable", "text/plain", body),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "try /metrics, /healthz or /readyz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
