//! Frames: the unit that crosses a braid connection.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "BRD1"
//!      4     1  version (1)
//!      5     1  kind (0 request, 1 response, 2 handshake, 3 callback, 4 callback ack)
//!      6     2  flags (reserved, 0)
//!      8     8  request id
//!     16     4  message length   (postcard bytes, at most FrameLimits::max_msg_bytes)
//!     20     4  payload length   (raw bulk bytes, at most FrameLimits::max_payload_bytes)
//!     24     4  CRC32C of bytes 0..24, the message and the payload
//! ```
//!
//! Every frame is checksummed end to end and the receiver verifies it before it acts,
//! so a flipped bit on the wire never reaches an object or the namespace. Callbacks go
//! the other way: a server asks a client to give something up (a lease) on the
//! client's own connection, and the client answers with an ack of the same id. Lengths are
//! checked against limits *before* anything is allocated, so a hostile header cannot
//! make a server allocate gigabytes.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const MAGIC: [u8; 4] = *b"BRD1";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Response = 1,
    Handshake = 2,
    /// Server to client: a [`crate::msg::Callback`].
    Callback = 3,
    /// Client to server: the callback of this id was carried out.
    CallbackAck = 4,
}

/// Size limits a receiver enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    pub max_msg_bytes: u32,
    pub max_payload_bytes: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        // Control messages are small; a readdir batch or a large xattr stays well
        // under 1 MiB. Bulk RPCs carry at most 4 MiB (Lustre's largest BRW), so 16 MiB
        // leaves headroom for configuration without inviting abuse.
        FrameLimits { max_msg_bytes: 1 << 20, max_payload_bytes: 16 << 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub request_id: u64,
    pub msg_len: u32,
    pub payload_len: u32,
    pub crc: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub request_id: u64,
    pub msg: Bytes,
    pub payload: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?} (not a braid peer?)")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MsgTooLarge { len: u32, max: u32 },
    #[error("payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge { len: u32, max: u32 },
    #[error("checksum mismatch (got {got:#010x}, computed {want:#010x})")]
    Checksum { got: u32, want: u32 },
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("i/o: {0}")]
    Io(String),
}

/// Parses and checks a header against `limits`.
pub fn decode_header(buf: &[u8; HEADER_LEN], limits: &FrameLimits) -> Result<Header, FrameError> {
    let magic: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if buf[4] != VERSION {
        return Err(FrameError::BadVersion(buf[4]));
    }
    let kind = match buf[5] {
        0 => FrameKind::Request,
        1 => FrameKind::Response,
        2 => FrameKind::Handshake,
        3 => FrameKind::Callback,
        4 => FrameKind::CallbackAck,
        k => return Err(FrameError::BadKind(k)),
    };
    let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
    let request_id = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let msg_len = u32_at(16);
    let payload_len = u32_at(20);
    if msg_len > limits.max_msg_bytes {
        return Err(FrameError::MsgTooLarge { len: msg_len, max: limits.max_msg_bytes });
    }
    if payload_len > limits.max_payload_bytes {
        return Err(FrameError::PayloadTooLarge { len: payload_len, max: limits.max_payload_bytes });
    }
    Ok(Header { kind, request_id, msg_len, payload_len, crc: u32_at(24) })
}

fn encode_header(kind: FrameKind, request_id: u64, msg: &[u8], payload: &[Bytes]) -> [u8; HEADER_LEN] {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = kind as u8;
    h[8..16].copy_from_slice(&request_id.to_le_bytes());
    h[16..20].copy_from_slice(&(msg.len() as u32).to_le_bytes());
    h[20..24].copy_from_slice(&(payload_len as u32).to_le_bytes());
    let mut crc = crc32c::crc32c(&h[..24]);
    crc = crc32c::crc32c_append(crc, msg);
    for p in payload {
        crc = crc32c::crc32c_append(crc, p);
    }
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

fn check_crc(header_bytes: &[u8; HEADER_LEN], h: &Header, msg: &[u8], payload: &[u8]) -> Result<(), FrameError> {
    let mut crc = crc32c::crc32c(&header_bytes[..24]);
    crc = crc32c::crc32c_append(crc, msg);
    crc = crc32c::crc32c_append(crc, payload);
    if crc != h.crc {
        return Err(FrameError::Checksum { got: h.crc, want: crc });
    }
    Ok(())
}

/// Decodes one frame from the front of `buf`; returns it and the bytes consumed.
/// This is the function the fuzzer drives.
pub fn decode_frame(buf: &[u8], limits: &FrameLimits) -> Result<(Frame, usize), FrameError> {
    if buf.len() < HEADER_LEN {
        return Err(FrameError::Truncated { need: HEADER_LEN, have: buf.len() });
    }
    let hb: &[u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("header length");
    let h = decode_header(hb, limits)?;
    let total = HEADER_LEN + h.msg_len as usize + h.payload_len as usize;
    if buf.len() < total {
        return Err(FrameError::Truncated { need: total, have: buf.len() });
    }
    let msg = &buf[HEADER_LEN..HEADER_LEN + h.msg_len as usize];
    let payload = &buf[HEADER_LEN + h.msg_len as usize..total];
    check_crc(hb, &h, msg, payload)?;
    Ok((
        Frame {
            kind: h.kind,
            request_id: h.request_id,
            msg: Bytes::copy_from_slice(msg),
            payload: Bytes::copy_from_slice(payload),
        },
        total,
    ))
}

/// Encodes a frame into one buffer (tests, fuzz corpus, small frames).
pub fn encode_frame(kind: FrameKind, request_id: u64, msg: &[u8], payload: &[u8]) -> Vec<u8> {
    let p = [Bytes::copy_from_slice(payload)];
    let h = encode_header(kind, request_id, msg, &p);
    let mut out = Vec::with_capacity(HEADER_LEN + msg.len() + payload.len());
    out.extend_from_slice(&h);
    out.extend_from_slice(msg);
    out.extend_from_slice(payload);
    out
}

/// Capacity of the buffered reader a connection reads frames through. Small frames
/// (headers, messages, 4 KiB payloads) come several to a read; a payload larger than
/// the buffer skips it once the buffered part is taken (tokio's `BufReader` reads
/// straight into the frame's own buffer then), so a 1 MiB read answer is copied
/// once by the kernel and not again out of the buffer.
pub const READ_BUFFER_BYTES: usize = 32 << 10;

/// Reads one frame. `Ok(None)` on a clean end of stream before a header.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, limits: &FrameLimits) -> Result<Option<Frame>, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    match r.read_exact(&mut hb).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(FrameError::Io(e.to_string())),
    }
    let h = decode_header(&hb, limits)?;
    let msg = read_exact_bytes(r, h.msg_len as usize).await?;
    let payload = read_exact_bytes(r, h.payload_len as usize).await?;
    check_crc(&hb, &h, &msg, &payload)?;
    Ok(Some(Frame { kind: h.kind, request_id: h.request_id, msg, payload }))
}

async fn read_exact_bytes<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> Result<Bytes, FrameError> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    // No zero-fill: read straight into spare capacity, bounded by `take`.
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        let n = r.take(want).read_buf(&mut buf).await.map_err(|e| FrameError::Io(e.to_string()))?;
        if n == 0 {
            return Err(FrameError::Truncated { need: len, have: buf.len() });
        }
    }
    Ok(buf.freeze())
}

/// Writes one frame; the payload may be gathered from several buffers.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: FrameKind,
    request_id: u64,
    msg: &[u8],
    payload: &[Bytes],
) -> std::io::Result<()> {
    let h = encode_header(kind, request_id, msg, payload);
    let mut head = Vec::with_capacity(HEADER_LEN + msg.len());
    head.extend_from_slice(&h);
    head.extend_from_slice(msg);
    w.write_all(&head).await?;
    for p in payload {
        w.write_all(p).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let buf = encode_frame(FrameKind::Request, 7, b"hello", b"payload");
        let (f, n) = decode_frame(&buf, &FrameLimits::default()).unwrap();
        assert_eq!(n, buf.len());
        assert_eq!(f.request_id, 7);
        assert_eq!(&f.msg[..], b"hello");
        assert_eq!(&f.payload[..], b"payload");
    }

    #[test]
    fn rejects_corruption_and_limits() {
        let limits = FrameLimits::default();
        let mut buf = encode_frame(FrameKind::Request, 1, b"m", b"data");
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert!(matches!(decode_frame(&buf, &limits), Err(FrameError::Checksum { .. })));
        let mut buf = encode_frame(FrameKind::Request, 1, b"m", b"");
        buf[0] = b'X';
        assert!(matches!(decode_frame(&buf, &limits), Err(FrameError::BadMagic(_))));
        let mut buf = encode_frame(FrameKind::Request, 1, b"m", b"");
        buf[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_frame(&buf, &limits), Err(FrameError::PayloadTooLarge { .. })));
        let buf = encode_frame(FrameKind::Request, 1, b"message", b"");
        assert!(matches!(decode_frame(&buf[..buf.len() - 1], &limits), Err(FrameError::Truncated { .. })));
    }

    #[tokio::test]
    async fn async_read_matches_sync_decode() {
        let buf = encode_frame(FrameKind::Response, 9, b"abc", &[5u8; 100_000]);
        let mut r = &buf[..];
        let f = read_frame(&mut r, &FrameLimits::default()).await.unwrap().unwrap();
        assert_eq!(f, decode_frame(&buf, &FrameLimits::default()).unwrap().0);
        assert!(read_frame(&mut r, &FrameLimits::default()).await.unwrap().is_none());
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn decoder_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_frame(&bytes, &FrameLimits::default());
        }

        /// Valid frames with any single corrupted byte are rejected or decode to the
        /// same frame (never to a different one).
        #[test]
        fn single_byte_corruption_is_caught(msg in proptest::collection::vec(any::<u8>(), 0..64),
                                           pos in 0usize..92, bit in 0u8..8) {
            let buf = encode_frame(FrameKind::Request, 3, &msg, b"0123456789");
            let mut bad = buf.clone();
            let pos = pos % bad.len();
            bad[pos] ^= 1 << bit;
            prop_assert!(decode_frame(&bad, &FrameLimits::default()).is_err());
        }
    }
}
