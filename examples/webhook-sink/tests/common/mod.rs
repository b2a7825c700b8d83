//! A local HTTP/1.1 server for the tests: records every request and answers what the test
//! tells it to. Minimal on purpose (request line, headers, `Content-Length` bodies,
//! keep-alive) — enough for an HTTP client, no dependency.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as the server received it, and what it answered.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The request target as sent (`/hooks/order`).
    pub path: String,
    /// Header names lowercased; repeated headers joined with `, `.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// The status the server answered.
    pub status: u16,
}

impl Recorded {
    /// Whether the server answered 2xx.
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {}: body is not JSON ({e}): {}",
                self.method,
                self.path,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// Decides the reply to a request (the request is not yet in [`TestServer::requests`]).
pub type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

#[derive(Default)]
struct State {
    requests: Mutex<Vec<Recorded>>,
    responder: RwLock<Option<Responder>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The server; stops when dropped.
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// A server answering `200 OK` to everything, on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port for the test HTTP server");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(State::default());
        let task = tokio::spawn(accept_loop(listener, state.clone()));
        Self { addr, state, task }
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer with `responder` from now on.
    pub fn respond_with(&self, responder: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) {
        *self.state.responder.write().unwrap() = Some(Arc::new(responder));
    }

    /// Every request so far, in the order they were received.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The requests to `path` answered 2xx, in the order received.
    pub fn accepted_at(&self, path: &str) -> Vec<Recorded> {
        self.state
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.accepted() && r.path == path)
            .cloned()
            .collect()
    }

    /// The most requests that were being answered at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Poll `condition` on the recorded requests until it holds or `timeout` passes; returns
    /// whether it held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        condition: impl Fn(&[Recorded]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if condition(&self.state.requests.lock().unwrap()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve_connection(stream, state.clone()));
    }
}

/// Answer requests on one connection until the client closes it.
async fn serve_connection(stream: TcpStream, state: Arc<State>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, path) = (method.to_owned(), path.to_owned());
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        loop {
            let mut header = String::new();
            match reader.read_line(&mut header).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let header = header.trim_end_matches(['\r', '\n']);
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return;
            };
            headers
                .entry(name.trim().to_ascii_lowercase())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(value.trim());
                })
                .or_insert_with(|| value.trim().to_owned());
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let close = headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let mut request = Recorded {
            method,
            path,
            headers,
            body,
            status: 0,
        };

        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let responder = state.responder.read().unwrap().clone();
        let reply = match responder {
            Some(responder) => responder(&request),
            None => Reply::status(200),
        };
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        request.status = reply.status;
        let is_head = request.method == "HEAD";
        // Recorded before the answer leaves: whoever sees the answer finds the request here.
        state.requests.lock().unwrap().push(request);
        state.in_flight.fetch_sub(1, Ordering::SeqCst);

        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-length: {}\r\n",
            reply.status,
            reason(reply.status),
            reply.body.len()
        );
        for (name, value) in &reply.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let stream = reader.get_mut();
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        if !is_head && stream.write_all(reply.body.as_bytes()).await.is_err() {
            return;
        }
        if close {
            return;
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// A loopback port where nothing listens (it was free a moment ago).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    listener.local_addr().expect("local address").port()
}
