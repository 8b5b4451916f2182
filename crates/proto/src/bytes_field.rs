//! `#[serde(with = "proto::bytes_field")]` for a `Vec<u8>` field: encoded as one byte
//! string instead of a sequence of bytes, each its own call into the serializer.
//!
//! postcard writes both the same way (a varint length, then the bytes), so records and
//! messages written before keep decoding. A DoM write's 4 KiB went through serde one
//! byte at a time on the MDS, three times (the request, its journal record, the
//! database value): 7 % of the MDS's CPU writing small DoM files.

use serde::de::{Deserializer, Error, SeqAccess, Visitor};
use serde::Serializer;

pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(BytesVisitor)
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // Formats that write bytes as a sequence; bounded by what the input holds.
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element()? {
            v.push(b);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Plain(u32, Vec<u8>, Vec<u8>);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Bytes(u32, #[serde(with = "super")] Vec<u8>, #[serde(with = "super")] Vec<u8>);

    #[test]
    fn bytes_encode_as_a_sequence_of_bytes_did_and_decode_both_ways() {
        for len in [0usize, 1, 127, 128, 4096, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let plain = postcard::to_allocvec(&Plain(9, data.clone(), b"k".to_vec())).unwrap();
            let bytes = postcard::to_allocvec(&Bytes(9, data.clone(), b"k".to_vec())).unwrap();
            assert_eq!(plain, bytes, "{len} bytes: the same encoding");
            let back: Bytes = postcard::from_bytes(&plain).unwrap();
            assert_eq!(back, Bytes(9, data, b"k".to_vec()));
        }
        // A length past the input is an error, not an allocation.
        assert!(postcard::from_bytes::<Bytes>(&[9, 0xff, 0xff, 0xff, 0x0f, 1]).is_err());
    }
}
