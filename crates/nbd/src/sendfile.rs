//! Read replies sent straight from local files: `sendfile` hands the pages of the
//! kernel's page cache to the socket, so bytes a backend has in a local file (a braid
//! client's short-circuit object files) never pass through this process.
//!
//! Why: a sequential copy out of an export is bound by the CPU copying bytes; reading
//! a range into memory and writing it to the socket copies it twice in this process
//! (nbdkit's `file` plugin does the same), `sendfile` not at all, and the client's
//! `recv` copies it once as ever (docs/benchmarks.md, issue 17).
//!
//! A file's pages may still be on disk, so the sending runs on the blocking pool, one
//! reply at a time per connection (its outbox's writer waits for it), through a
//! duplicate of the connection's socket: the runtime's threads never wait for a disk,
//! and a connection closed meanwhile leaves the duplicate valid.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// `len` bytes of `file` from `offset` (zeros past its end), or `len` zeros without a
/// file.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Option<Arc<File>>,
    pub offset: u64,
    pub len: u64,
}

/// Longest a reply waits for room in the client's socket before the connection is
/// given up (a client that stopped reading).
const STALL_MAX: Duration = Duration::from_secs(60);

/// Zeros to send from.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Sends `ranges` whole and in order on `sock`, from a thread of the blocking pool.
pub async fn send(sock: &impl AsFd, ranges: Vec<FileRange>) -> io::Result<()> {
    let sock = sock.as_fd().try_clone_to_owned()?;
    tokio::task::spawn_blocking(move || send_blocking(&sock, &ranges))
        .await
        .map_err(|e| io::Error::other(format!("sending file ranges: {e}")))?
}

/// `ranges` read into memory, whole and in order (for a connection that cannot take
/// `sendfile`: TLS encrypts what it sends).
pub fn read(ranges: &[FileRange]) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    let mut out = vec![0u8; total as usize];
    let mut at = 0usize;
    for r in ranges {
        let buf = &mut out[at..at + r.len as usize];
        if let Some(f) = &r.file {
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], r.offset + done as u64) {
                    // Past the end of the file: the zeros already there.
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        at += r.len as usize;
    }
    Ok(out)
}

fn send_blocking(sock: &OwnedFd, ranges: &[FileRange]) -> io::Result<()> {
    for r in ranges {
        let sent = match &r.file {
            Some(f) => sendfile_at_most(sock.as_raw_fd(), f, r.offset, r.len)?,
            None => 0,
        };
        let mut zeros = r.len - sent;
        while zeros > 0 {
            let n = zeros.min(ZEROS.len() as u64) as usize;
            send_all(sock.as_raw_fd(), &ZEROS[..n])?;
            zeros -= n as u64;
        }
    }
    Ok(())
}

/// Sends up to `len` bytes of `file` from `offset`; fewer at the file's end.
fn sendfile_at_most(sock: RawFd, file: &File, offset: u64, len: u64) -> io::Result<u64> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut sent = 0u64;
    while sent < len {
        let want = (len - sent).min(1 << 30) as usize;
        // SAFETY: two open descriptors and a valid offset pointer.
        let n = unsafe { libc::sendfile(sock, file.as_raw_fd(), &mut off, want) };
        match n {
            0 => break,
            n if n > 0 => sent += n as u64,
            _ => retry_or_fail(sock)?,
        }
    }
    Ok(sent)
}

fn send_all(sock: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: a valid buffer of the length given.
        let n = unsafe { libc::send(sock, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n >= 0 {
            buf = &buf[n as usize..];
        } else {
            retry_or_fail(sock)?;
        }
    }
    Ok(())
}

/// After a failed send: waits for room in the socket if that was all, else fails.
fn retry_or_fail(sock: RawFd) -> io::Result<()> {
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock => {
            let mut p = libc::pollfd { fd: sock, events: libc::POLLOUT, revents: 0 };
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(&mut p, 1, STALL_MAX.as_millis() as libc::c_int) };
            match n {
                0 => Err(io::Error::new(io::ErrorKind::TimedOut, "the client read nothing for a minute")),
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
                _ => Ok(()),
            }
        }
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Ranges of a file, zeros, and a range running past the file's end arrive as
    /// those bytes, in order, through a socket the reader empties slowly (the sender
    /// waits for room again and again).
    #[tokio::test]
    async fn ranges_arrive_whole_in_order_with_zeros_past_the_end() {
        let path = std::env::temp_dir().join(format!("braid-nbd-sendfile-{}", std::process::id()));
        let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &content).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let ranges = vec![
            FileRange { file: Some(file.clone()), offset: 0, len: 50_000 },
            FileRange { file: None, offset: 7, len: 3_000 },
            FileRange { file: Some(file.clone()), offset: 90_000, len: 4 << 20 },
        ];
        let mut want = content[..50_000].to_vec();
        want.extend_from_slice(&[0u8; 3_000]);
        want.extend_from_slice(&content[90_000..]);
        want.resize(want.len() + (4 << 20) - 10_000, 0);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return got;
                }
                got.extend_from_slice(&buf[..n]);
                if got.len() % 64 == 0 {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            }
        });
        let (sock, _) = listener.accept().await.unwrap();
        send(&sock, ranges).await.unwrap();
        drop(sock);
        let got = tokio::time::timeout(Duration::from_secs(60), reader).await.unwrap().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bytes sent are the ranges'");
        std::fs::remove_file(&path).unwrap();
    }
}
