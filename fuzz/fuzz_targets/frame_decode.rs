//! Drives the frame decoder and the message decoders with arbitrary bytes: see
//! [`braid_fuzz::frame_decode`], which the corpus test also runs on stable Rust.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    braid_fuzz::frame_decode(data);
});
