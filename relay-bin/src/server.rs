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

/// `listen` as an address; the error says what to write instead (a host name is not resolved:
/// `localhost:9464` is `127.0.0.1:9464`).
pub fn listen_address(listen: &str) -> Result<SocketAddr, String> {
    listen.parse().map_err(|_| {
        let port = listen.rsplit(':').next().filter(|p| p.parse::<u16>().is_ok());
        let instead = match port {
            Some(port) => format!(
                ": write 127.0.0.1:{port} for this host only, or 0.0.0.0:{port} for every \
                 interface"
            ),
            None => String::new(),
        };
        format!("server.listen: \"{listen}\" is not an IP address and port like 127.0.0.1:9464{instead}")
    })
}

/// Bind `listen`; the error names the address.
pub async fn bind(listen: &str) -> Result<TcpListener, String> {
    let addr = listen_address(listen)?;
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
    // HEAD answers as GET does, without the body (load balancers' health checks use it).
    let known = matches!(method, "GET" | "HEAD");
    let (status, content_type, body) = match path {
        _ if !known => (
            "405 Method Not Allowed",
            "text/plain",
            "GET or HEAD only\n".to_owned(),
        ),
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        "/healthz" if relay.is_alive() => ("200 OK", "text/plain", "ok\n".to_owned()),
        "/healthz" => (
            "503 Service Unavailable",
            "text/plain",
            "stopped\n".to_owned(),
        ),
        "/readyz" => match relay.readiness() {
            (true, body) => ("200 OK", "text/plain", body),
            (false, body) => ("503 Service Unavailable", "text/plain", body),
        },
        _ => (
            "404 Not Found",
            "text/plain",
            "try /metrics, /healthz or /readyz\n".to_owned(),
        ),
    };
    let allow = if known { "" } else { "Allow: GET, HEAD\r\n" };
    let head = format!(
        "HTTP/1.1 {status}\r\n{allow}Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    /// The whole answer to `request`, sent raw.
    fn ask(port: u16, request: &str) -> String {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn head_answers_as_get_without_the_body_and_other_methods_are_told_what_is_allowed() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let metrics = PrometheusBuilder::new().build_recorder().handle();
        let (trigger, shutdown) = Shutdown::channel();
        let server = tokio::spawn(serve(listener, Board::default(), metrics, shutdown));

        let answers = tokio::task::spawn_blocking(move || {
            ["GET", "HEAD", "POST"].map(|method| {
                ask(
                    port,
                    &format!("{method} /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"),
                )
            })
        })
        .await
        .unwrap();
        let [get, head, post] = &answers;
        let (get_head, get_body) = get.split_once("\r\n\r\n").unwrap();
        let (head_head, head_body) = head.split_once("\r\n\r\n").unwrap();
        assert!(!get_body.is_empty(), "{get}");
        assert_eq!(
            head_head, get_head,
            "HEAD has GET's status line and headers"
        );
        assert_eq!(head_body, "", "HEAD has no body");
        assert!(
            post.starts_with("HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n"),
            "{post}"
        );

        trigger.trigger();
        server.await.unwrap();
    }
}
