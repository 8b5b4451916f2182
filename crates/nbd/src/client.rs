//! A small blocking NBD client: the fixed newstyle handshake with `NBD_OPT_GO`, then
//! pipelined requests with simple replies. It is what `braid bench sweep --preset
//! nbd` measures exports with, braid's and any other server's alike, so the figures
//! do not depend on which tools the machine has.
//!
//! Requests go out as the caller submits them and replies are read in the order the
//! server sends them (any order): a caller keeps N in flight by submitting one more
//! for each it completes. The server must read requests while it writes replies
//! (every NBD server does), or a write's payload and a read's reply could block each
//! other.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::proto::*;

/// Most bytes one request may carry here (the servers' usual limit is 32 MiB).
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

/// An export, connected and past the handshake.
pub struct Client {
    sock: TcpStream,
    /// The export's size in bytes.
    pub size: u64,
    /// Its transmission flags (`TX_*`).
    pub flags: u16,
    next_cookie: u64,
    /// Reads in flight: cookie → length of the data their reply carries.
    reads: HashMap<u64, u32>,
    scratch: Vec<u8>,
}

/// One completed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub cookie: u64,
    /// The server's error (0: success).
    pub error: u32,
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// `nbd://HOST:PORT[/EXPORT]` (the port defaults to 10809) as (address, export).
pub fn parse_uri(uri: &str) -> io::Result<(String, String)> {
    let rest = uri.strip_prefix("nbd://").ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: expected nbd://HOST[:PORT][/EXPORT]"))
    })?;
    let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: no host")));
    }
    let addr = if host.contains(':') { host.to_string() } else { format!("{host}:10809") };
    Ok((addr, export.to_string()))
}

impl Client {
    /// Connects to `uri` and opens its export.
    pub fn connect(uri: &str) -> io::Result<Client> {
        let (addr, export) = parse_uri(uri)?;
        let sock = TcpStream::connect(&addr).map_err(|e| io::Error::new(e.kind(), format!("{addr}: {e}")))?;
        sock.set_nodelay(true)?;
        let mut c = Client { sock, size: 0, flags: 0, next_cookie: 1, reads: HashMap::new(), scratch: Vec::new() };
        c.handshake(&export).map_err(|e| io::Error::new(e.kind(), format!("{uri}: handshake: {e}")))?;
        Ok(c)
    }

    fn handshake(&mut self, export: &str) -> io::Result<()> {
        let mut hello = [0u8; 18];
        self.sock.read_exact(&mut hello)?;
        let magic = u64::from_be_bytes(hello[0..8].try_into().expect("8 bytes"));
        let opt = u64::from_be_bytes(hello[8..16].try_into().expect("8 bytes"));
        if magic != NBDMAGIC || opt != IHAVEOPT {
            return Err(invalid("not a newstyle NBD server"));
        }
        let server_flags = u16::from_be_bytes([hello[16], hello[17]]);
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(invalid("the server does not speak fixed newstyle"));
        }
        let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
        if server_flags & FLAG_NO_ZEROES != 0 {
            client_flags |= FLAG_C_NO_ZEROES;
        }
        // NBD_OPT_GO: the export's name and no information requests.
        let mut data = Vec::with_capacity(6 + export.len());
        data.extend_from_slice(&(export.len() as u32).to_be_bytes());
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut msg = client_flags.to_be_bytes().to_vec();
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
        msg.extend_from_slice(&data);
        self.sock.write_all(&msg)?;
        loop {
            let mut head = [0u8; 20];
            self.sock.read_exact(&mut head)?;
            let magic = u64::from_be_bytes(head[0..8].try_into().expect("8 bytes"));
            let kind = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(head[16..20].try_into().expect("4 bytes"));
            if magic != OPTION_REPLY_MAGIC {
                return Err(invalid(format!("bad option reply magic {magic:#x}")));
            }
            if len > 64 << 10 {
                return Err(invalid(format!("option reply of {len} bytes")));
            }
            let mut body = vec![0u8; len as usize];
            self.sock.read_exact(&mut body)?;
            match kind {
                REP_ACK => break,
                REP_INFO if body.len() >= 12 && u16::from_be_bytes([body[0], body[1]]) == INFO_EXPORT => {
                    self.size = u64::from_be_bytes(body[2..10].try_into().expect("8 bytes"));
                    self.flags = u16::from_be_bytes([body[10], body[11]]);
                }
                REP_INFO => {}
                k if k & (1 << 31) != 0 => {
                    let why = String::from_utf8_lossy(&body).into_owned();
                    return Err(invalid(format!("export '{export}' refused ({k:#x}): {why}")));
                }
                k => return Err(invalid(format!("unexpected option reply {k}"))),
            }
        }
        if self.flags & TX_HAS_FLAGS == 0 {
            return Err(invalid("the server sent no export information"));
        }
        Ok(())
    }

    /// Sends one request (`payload` is a write's data); returns its cookie.
    pub fn submit(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> io::Result<u64> {
        if length > MAX_REQUEST_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("request of {length} bytes")));
        }
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let head = Request { flags, kind, cookie, offset, length }.encode();
        if kind == CMD_WRITE {
            if payload.len() != length as usize {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "a write's payload must be its length"));
            }
            let mut bufs = [io::IoSlice::new(&head), io::IoSlice::new(payload)];
            let mut bufs = &mut bufs[..];
            while !bufs.is_empty() {
                let n = self.sock.write_vectored(bufs)?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                io::IoSlice::advance_slices(&mut bufs, n);
            }
        } else {
            self.sock.write_all(&head)?;
        }
        if kind == CMD_READ {
            self.reads.insert(cookie, length);
        }
        Ok(cookie)
    }

    /// Waits for the next reply (a read's data is read and dropped).
    pub fn complete(&mut self) -> io::Result<Completion> {
        let mut head = [0u8; 16];
        self.sock.read_exact(&mut head)?;
        let magic = u32::from_be_bytes(head[0..4].try_into().expect("4 bytes"));
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(invalid(format!("bad reply magic {magic:#x}")));
        }
        let error = u32::from_be_bytes(head[4..8].try_into().expect("4 bytes"));
        let cookie = u64::from_be_bytes(head[8..16].try_into().expect("8 bytes"));
        if let Some(len) = self.reads.remove(&cookie) {
            if error == 0 {
                self.scratch.resize(len as usize, 0);
                self.sock.read_exact(&mut self.scratch)?;
            }
        }
        Ok(Completion { cookie, error })
    }

    /// Ends the session (`NBD_CMD_DISC`) after every reply in flight has come.
    pub fn disconnect(mut self) -> io::Result<()> {
        let head = Request { flags: 0, kind: CMD_DISC, cookie: 0, offset: 0, length: 0 }.encode();
        self.sock.write_all(&head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_an_address_and_an_export() {
        assert_eq!(parse_uri("nbd://127.0.0.1:10831/disk").unwrap(), ("127.0.0.1:10831".into(), "disk".into()));
        assert_eq!(parse_uri("nbd://host").unwrap(), ("host:10809".into(), "".into()));
        for bad in ["127.0.0.1:10809", "nbd:///disk", "http://a/b"] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }
}
