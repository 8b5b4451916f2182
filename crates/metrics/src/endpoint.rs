//! The HTTP endpoint Prometheus scrapes (`--metrics ADDR`): `GET /metrics` answers the
//! registry in the text format; anything else gets a short error and the connection
//! closes.
//!
//! Bounded so that scrapers cannot take the file service's CPU or memory: at most
//! [`MAX_SCRAPES`] connections are served at once (more are closed unanswered), a
//! request must arrive whole within [`REQUEST_TIMEOUT`] and [`MAX_REQUEST_BYTES`], an
//! answer must be taken within [`REQUEST_TIMEOUT`], and each connection gets one answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::Registry;

/// Connections served at once.
pub const MAX_SCRAPES: usize = 8;
/// How long a scraper has to send its request, and to take the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head taken.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;

/// The content type of the text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `addr` and serves `registry` there on this runtime. The bound address.
pub async fn spawn(addr: &str, registry: &'static Registry) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve(listener, registry));
    Ok(local)
}

/// Serves scrapes on `listener` until it fails.
pub async fn serve(listener: TcpListener, registry: &'static Registry) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics endpoint: {MAX_SCRAPES} scrapes in progress; closing");
            continue;
        };
        tokio::spawn(async move {
            if let Err(e) = answer(stream, registry).await {
                tracing::debug!(%peer, "metrics endpoint: {e}");
            }
            drop(slot);
        });
    }
}

async fn answer(mut stream: TcpStream, registry: &'static Registry) -> std::io::Result<()> {
    let head = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return reply(&mut stream, "431 Request Header Fields Too Large", "request too large\n").await,
        Ok(Err(e)) => return Err(e),
        Err(_) => return reply(&mut stream, "408 Request Timeout", "request not received in time\n").await,
    };
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return reply(&mut stream, "400 Bad Request", "not an HTTP/1 request\n").await;
    }
    let path = target.unwrap_or_default().split('?').next().unwrap_or_default();
    match (method, path) {
        (Some("GET"), "/metrics") => {
            let body = registry.render();
            respond(&mut stream, "200 OK", CONTENT_TYPE, &body).await
        }
        (Some("GET"), "/") => reply(&mut stream, "200 OK", "braid metrics: GET /metrics\n").await,
        (Some("GET"), _) => reply(&mut stream, "404 Not Found", "no such page: try /metrics\n").await,
        _ => reply(&mut stream, "405 Method Not Allowed", "only GET is served\n").await,
    }
}

/// Reads up to the blank line that ends a request head; `None` if it is too long.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before a whole request"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return Ok(None);
        }
    }
}

async fn reply(stream: &mut TcpStream, status: &str, text: &str) -> std::io::Result<()> {
    respond(stream, status, "text/plain; charset=utf-8", text).await
}

async fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(REQUEST_TIMEOUT, write).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the scraper did not take the answer"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Counter, Family};

    /// Fetches `path` from the endpoint at `addr`: the status line's code and the body.
    async fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut raw = Vec::new();
        tokio::time::timeout(REQUEST_TIMEOUT * 2, s.read_to_end(&mut raw))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{addr} did not answer")))??;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer"))?;
        let code = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no status code"))?;
        Ok((code, body.to_string()))
    }

    fn registry() -> &'static Registry {
        let r: &'static Registry = Box::leak(Box::default());
        let f = r.register(Family::<(), Counter>::new("braid_test_total", "A test counter."));
        f.with(&(), |c| c.add(7));
        r
    }

    #[tokio::test]
    async fn scrapes_are_answered_and_garbage_gets_an_error() {
        let addr = spawn("127.0.0.1:0", registry()).await.unwrap().to_string();
        let (code, body) = get(&addr, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("braid_test_total 7\n"), "{body}");
        assert_eq!(get(&addr, "/nope").await.unwrap().0, 404);

        for garbage in [&b"\x00\xff\r\n\r\n"[..], b"POST /metrics HTTP/1.1\r\n\r\n", &[b'x'; 20000]] {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(garbage).await.unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            let out = String::from_utf8_lossy(&out);
            assert!(out.starts_with("HTTP/1.1 4"), "{out}");
        }
    }

    #[tokio::test]
    async fn silent_connections_beyond_the_bound_do_not_stop_scrapes_for_long() {
        let addr = spawn("127.0.0.1:0", registry()).await.unwrap().to_string();
        // Scrapers that connect and say nothing hold every slot until the timeout.
        let mut idle = Vec::new();
        for _ in 0..MAX_SCRAPES * 4 {
            idle.push(TcpStream::connect(&addr).await.unwrap());
        }
        let started = std::time::Instant::now();
        let mut answered = false;
        while started.elapsed() < REQUEST_TIMEOUT * 3 {
            if let Ok((200, _)) = get(&addr, "/metrics").await {
                answered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(answered, "no scrape answered while silent connections were open");
    }
}
