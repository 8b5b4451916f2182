//! Drives the NBD decoders and the trace batch decoder with arbitrary bytes: see
//! [`braid_fuzz::nbd_decode`], which the corpus test also runs on stable Rust.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_fuzz::nbd_decode(data);
});
