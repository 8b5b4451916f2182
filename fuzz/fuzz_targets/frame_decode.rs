//! Drives the frame decoder and the request decoder with arbitrary bytes.
//!
//! Arbitrary input almost never carries a valid CRC32C, so the first byte picks a
//! mode: raw bytes as a frame (header, limits and checksum checks), or the rest of
//! the input wrapped in a correctly checksummed frame, so that the message decoder
//! behind it gets explored too. Either way a decoded frame must re-encode to exactly
//! the bytes it came from, and decoding its message must not panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::{decode_frame, encode_frame, FrameKind, FrameLimits, HEADER_LEN};
use proto::msg::{Request, Response};

fn check(buf: &[u8]) {
    let limits = FrameLimits::default();
    let Ok((frame, used)) = decode_frame(buf, &limits) else {
        return;
    };
    assert_eq!(used, HEADER_LEN + frame.msg.len() + frame.payload.len());
    assert!(used <= buf.len());
    assert!(frame.msg.len() <= limits.max_msg_bytes as usize);
    assert!(frame.payload.len() <= limits.max_payload_bytes as usize);
    let again = encode_frame(frame.kind, frame.request_id, &frame.msg, &frame.payload);
    assert_eq!(&again[..], &buf[..used], "a decoded frame re-encodes to its bytes");
    match frame.kind {
        FrameKind::Request => {
            if let Ok(req) = postcard::from_bytes::<Request>(&frame.msg) {
                // What decodes must encode back to a message that decodes the same.
                let bytes = postcard::to_stdvec(&req).expect("re-encode a request");
                let back = postcard::from_bytes::<Request>(&bytes).expect("decode re-encoded");
                assert_eq!(back, req);
                let _ = req.op_name();
            }
        }
        FrameKind::Response => {
            let _ = postcard::from_bytes::<Response>(&frame.msg);
        }
        FrameKind::Handshake => {
            let _ = postcard::from_bytes::<proto::msg::Hello>(&frame.msg);
        }
        FrameKind::Callback => {
            let _ = postcard::from_bytes::<proto::msg::Callback>(&frame.msg);
        }
        FrameKind::CallbackAck => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => check(rest),
        1 => {
            // A valid frame around the input: split it into message and payload.
            let cut = rest.first().map_or(0, |&b| b as usize).min(rest.len());
            let (msg, payload) = rest.split_at(cut);
            let kind = if mode & 0x80 == 0 { FrameKind::Request } else { FrameKind::Response };
            check(&encode_frame(kind, u64::from(mode), msg, payload));
        }
        _ => {
            let _ = postcard::from_bytes::<Request>(rest);
        }
    }
});
