//! Drives the NBD decoders with arbitrary bytes: a transmission request header, the
//! data of `NBD_OPT_GO`/`INFO`, of the meta-context options, and a trace batch as a
//! collection server receives it. None may panic; what decodes must encode back to
//! the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::proto::{InfoRequest, MetaRequest, Request, REQUEST_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(head) = <&[u8; REQUEST_BYTES]>::try_from(data.get(..REQUEST_BYTES).unwrap_or(&[])) {
        if let Ok(r) = Request::decode(head) {
            assert_eq!(&r.encode(), head);
        }
    }
    let _ = InfoRequest::decode(data);
    let _ = MetaRequest::decode(data);
    if let Ok(b) = trace::store::Batch::decode(data) {
        assert_eq!(b.encode(), data, "a decoded batch re-encodes to its bytes");
    }
});
