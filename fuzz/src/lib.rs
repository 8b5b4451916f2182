//! The bodies of the fuzz targets, as functions of the input bytes.
//!
//! `fuzz_targets/*.rs` hand them what libFuzzer generates (`cargo +nightly fuzz run
//! frame_decode`); `tests/corpus.rs` hands them every file of `corpus/<target>/` on
//! stable Rust, as an ordinary test. A decoder that starts to panic, to re-encode what
//! it decoded differently, or to reject the good input saved in the corpus then fails
//! the test run, not only a fuzzing session someone has to remember to start.
//!
//! Each function asserts what must hold of any input (a decoded value encodes back to
//! its bytes, or to a message that decodes the same) and returns what decoded, for
//! the corpus test to compare with what each saved input is known to be.

use nbd::proto::{InfoRequest, MetaRequest, Request as NbdRequest, REQUEST_BYTES};
use proto::frame::{decode_frame, encode_frame, FrameKind, FrameLimits, HEADER_LEN};
use proto::msg::{Callback, Hello, Request, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// What [`frame_decode`] made of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// The bytes are not a frame (or, in mode 2, not a request).
    Rejected,
    /// A frame whose message does not decode as its kind's message.
    BadMessage(FrameKind),
    /// A frame and its message, both decoded (a callback acknowledgement has none).
    Decoded(FrameKind),
    /// Mode 2: a bare request message, decoded.
    BareRequest,
}

/// Mode bytes of [`frame_decode`]'s input (the first byte, modulo 3).
pub const MODE_RAW: u8 = 0;
pub const MODE_WRAPPED: u8 = 1;
pub const MODE_BARE_REQUEST: u8 = 2;

/// Drives the frame decoder and the message decoders with `data`.
///
/// Arbitrary input almost never carries a valid CRC32C, so the first byte picks a
/// mode: the rest as a frame (header, limits and checksum checks), or the rest
/// wrapped in a correctly checksummed frame (split at its first byte into message
/// and payload), so that the message decoder behind it gets explored too, or the rest
/// as a bare request message. A decoded frame must re-encode to exactly the bytes it
/// came from, and a decoded message to one that decodes the same.
pub fn frame_decode(data: &[u8]) -> Frame {
    let Some((&mode, rest)) = data.split_first() else {
        return Frame::Rejected;
    };
    match mode % 3 {
        MODE_RAW => check_frame(rest),
        MODE_WRAPPED => {
            let cut = rest.first().map_or(0, |&b| b as usize).min(rest.len());
            let (msg, payload) = rest.split_at(cut);
            let kind = if mode & 0x80 == 0 { FrameKind::Request } else { FrameKind::Response };
            check_frame(&encode_frame(kind, u64::from(mode), msg, payload))
        }
        _ => match round_trip_request(rest) {
            Some(req) => {
                let _ = req.op_name();
                Frame::BareRequest
            }
            None => Frame::Rejected,
        },
    }
}

fn check_frame(buf: &[u8]) -> Frame {
    let limits = FrameLimits::default();
    let Ok((frame, used)) = decode_frame(buf, &limits) else {
        return Frame::Rejected;
    };
    assert_eq!(used, HEADER_LEN + frame.msg.len() + frame.payload.len());
    assert!(used <= buf.len());
    assert!(frame.msg.len() <= limits.max_msg_bytes as usize);
    assert!(frame.payload.len() <= limits.max_payload_bytes as usize);
    let again = encode_frame(frame.kind, frame.request_id, &frame.msg, &frame.payload);
    assert_eq!(&again[..], &buf[..used], "a decoded frame re-encodes to its bytes");
    let decoded = match frame.kind {
        FrameKind::Request => round_trip_request(&frame.msg).map(|r| r.op_name()).is_some(),
        FrameKind::Response => round_trip::<Response>(&frame.msg).is_some(),
        FrameKind::Handshake => round_trip::<Hello>(&frame.msg).is_some(),
        FrameKind::Callback => round_trip::<Callback>(&frame.msg).is_some(),
        FrameKind::CallbackAck => true,
    };
    if decoded {
        Frame::Decoded(frame.kind)
    } else {
        Frame::BadMessage(frame.kind)
    }
}

/// `msg` decoded as servers decode a request (with the job id that may follow it),
/// which must encode to a message that decodes the same.
fn round_trip_request(msg: &[u8]) -> Option<Request> {
    let (req, job) = proto::msg::decode_request(msg).ok()?;
    let bytes = proto::msg::encode_request(&req, job.as_deref()).expect("re-encode a decoded request");
    let back = proto::msg::decode_request(&bytes).expect("decode a re-encoded request");
    assert_eq!(back, (req.clone(), job), "a decoded request re-encodes to one that decodes the same");
    Some(req)
}

/// `msg` decoded as a `T`, which must encode to a message that decodes the same.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(msg: &[u8]) -> Option<T> {
    let value = postcard::from_bytes::<T>(msg).ok()?;
    let bytes = postcard::to_stdvec(&value).expect("re-encode a decoded message");
    let back = postcard::from_bytes::<T>(&bytes).expect("decode a re-encoded message");
    assert_eq!(back, value, "a decoded message re-encodes to one that decodes the same");
    Some(value)
}

/// What [`nbd_decode`] made of its input: which of the decoders accepted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Nbd {
    /// Its first `REQUEST_BYTES` as a transmission request header.
    pub request: bool,
    /// As the data of `NBD_OPT_GO`/`NBD_OPT_INFO`.
    pub info: bool,
    /// As the data of `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT`.
    pub meta: bool,
    /// As a trace batch (as a collection server receives it).
    pub batch: bool,
}

/// Drives the NBD decoders, and the trace batch decoder, with `data`. None may
/// panic; what decodes must encode back to the same bytes.
pub fn nbd_decode(data: &[u8]) -> Nbd {
    let mut got = Nbd::default();
    if let Some(head) = data.get(..REQUEST_BYTES) {
        let head: &[u8; REQUEST_BYTES] = head.try_into().expect("REQUEST_BYTES bytes");
        if let Ok(r) = NbdRequest::decode(head) {
            assert_eq!(&r.encode(), head, "a decoded request re-encodes to its bytes");
            got.request = true;
        }
    }
    if let Ok(i) = InfoRequest::decode(data) {
        assert_eq!(encode_info(&i), data, "a decoded NBD_OPT_GO re-encodes to its bytes");
        got.info = true;
    }
    if let Ok(m) = MetaRequest::decode(data) {
        assert_eq!(encode_meta(&m), data, "a decoded meta-context option re-encodes to its bytes");
        got.meta = true;
    }
    if let Ok(b) = trace::store::Batch::decode(data) {
        assert_eq!(b.encode(), data, "a decoded batch re-encodes to its bytes");
        got.batch = true;
    }
    got
}

/// The data of `NBD_OPT_GO`/`NBD_OPT_INFO` as a client sends it (the NBD protocol;
/// the server only decodes it, so its encoder lives here).
pub fn encode_info(i: &InfoRequest) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, &i.name);
    out.extend_from_slice(&(i.requests.len() as u16).to_be_bytes());
    for r in &i.requests {
        out.extend_from_slice(&r.to_be_bytes());
    }
    out
}

/// The data of `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT` as a client
/// sends it.
pub fn encode_meta(m: &MetaRequest) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, &m.name);
    out.extend_from_slice(&(m.queries.len() as u32).to_be_bytes());
    for q in &m.queries {
        put_string(&mut out, q);
    }
    out
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}
