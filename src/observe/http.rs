//! The operators' HTTP port (`[observe] listen`): `GET /metrics` (Prometheus text),
//! `/healthz` (the process serves) and `/readyz` (ready to take traffic, or 503 with
//! the reasons). One request per connection, its head read with a size and time bound:
//! nothing a caller sends can make it allocate more or wait longer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest request head read.
const MAX_HEAD: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the endpoints answer from.
pub struct Endpoints {
    /// The Prometheus text of every metric now.
    pub metrics: Box<dyn Fn() -> String + Send + Sync>,
    /// `Ok` when ready, else why not.
    pub ready: Box<dyn Fn() -> Result<(), Vec<String>> + Send + Sync>,
}

/// Binds `addr` and serves until the returned task is aborted.
pub async fn serve(
    addr: SocketAddr,
    endpoints: Endpoints,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let endpoints = Arc::new(endpoints);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, say: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(READ_TIMEOUT, answer(stream, &endpoints)).await;
            });
        }
    });
    Ok((bound, task))
}

async fn answer(mut stream: TcpStream, endpoints: &Endpoints) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
        if head.len() > MAX_HEAD {
            return respond(&mut stream, 431, "text/plain", "request head too large\n").await;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(&mut stream, 405, "text/plain", "only GET\n").await;
    }
    match path {
        "/metrics" => {
            let body = (endpoints.metrics)();
            respond(&mut stream, 200, "text/plain; version=0.0.4; charset=utf-8", &body).await
        }
        "/healthz" => respond(&mut stream, 200, "text/plain", "ok\n").await,
        "/readyz" => match (endpoints.ready)() {
            Ok(()) => respond(&mut stream, 200, "text/plain", "ready\n").await,
            Err(reasons) => {
                let body: String = reasons.iter().map(|r| format!("{r}\n")).collect();
                respond(&mut stream, 503, "text/plain", &body).await
            }
        },
        _ => respond(&mut stream, 404, "text/plain", "not found: /metrics, /healthz, /readyz\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: u16, content_type: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// The status code of `GET url` (`http://host:port/path`), within `timeout`.
pub fn probe(url: &str, timeout: std::time::Duration) -> Result<u16, String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(host)
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("not HTTP: {line}"))
}
