//! Which shard of a striped directory holds a name (Lustre's LMV hash types).
//!
//! A directory striped over N MDTs keeps each entry in shard `hash(name) % N`, so a
//! client finds the MDT of a name without asking anyone. The hashes are Lustre's, bit
//! for bit, so a name lands in the same shard as it would on Lustre for the same
//! stripe count: `fnv_1a_64` (the default: FNV-1a over the name's bytes, 64-bit) and
//! `all_char` (the sum of the bytes, for tests; it clusters names badly).

use serde::{Deserialize, Serialize};

/// Most shards a striped directory may have (each on its own MDT).
pub const DIR_STRIPES_MAX: u32 = 256;

/// A striped directory's name hash. New types go at the end: the order is part of
/// the stored and wire encodings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DirHash {
    #[default]
    Fnv1a64,
    AllChar,
}

impl DirHash {
    /// Lustre's name for it (`lmv_hash_type:`).
    pub fn name(self) -> &'static str {
        match self {
            DirHash::Fnv1a64 => "fnv_1a_64",
            DirHash::AllChar => "all_char",
        }
    }

    /// The type `lfs setdirstripe -H` names, as Lustre spells them.
    pub fn parse(s: &str) -> Result<DirHash, String> {
        match s {
            "fnv_1a_64" => Ok(DirHash::Fnv1a64),
            "all_char" => Ok(DirHash::AllChar),
            other => Err(format!("unknown directory hash type '{other}' (known: fnv_1a_64, all_char)")),
        }
    }

    /// The shard (0-based) of `name` in a directory of `count` shards.
    pub fn shard_of(self, name: &[u8], count: u32) -> u32 {
        let count = count.max(1);
        match self {
            DirHash::Fnv1a64 => (fnv_1a_64(name) % count as u64) as u32,
            DirHash::AllChar => name.iter().fold(0u32, |c, &b| c.wrapping_add(b as u32)) % count,
        }
    }
}

/// FNV-1a, 64-bit (Lustre's `lustre_hash_fnv_1a_64`).
pub fn fnv_1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BIAS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BIAS, |h, &b| (h ^ b as u64).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64 test vectors (Fowler, Noll and Vo's reference list).
    #[test]
    fn fnv_1a_64_matches_the_reference_vectors() {
        assert_eq!(fnv_1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv_1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv_1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Names and the shard Lustre's `lmv_hash_fnv1a` gives them for 2, 3, 4 and 8
    /// shards (`lustre_hash_fnv_1a_64(name) % count`), computed apart from this code.
    #[test]
    fn shards_are_lustres_for_the_same_name_and_count() {
        let long = "x".repeat(255);
        let vectors: [(&str, [u32; 4]); 10] = [
            ("a", [0, 1, 0, 4]),
            ("file.0", [1, 1, 1, 5]),
            ("file.1", [0, 0, 2, 2]),
            ("testfile", [1, 2, 3, 3]),
            ("dir1", [1, 1, 3, 7]),
            ("mdtest_tree.0.0", [1, 2, 1, 5]),
            ("f00", [1, 0, 1, 1]),
            ("résumé", [0, 1, 0, 4]),
            (".hidden", [1, 2, 1, 5]),
            (&long, [1, 2, 3, 7]),
        ];
        for (name, shards) in vectors {
            for (count, want) in [2, 3, 4, 8].into_iter().zip(shards) {
                assert_eq!(DirHash::Fnv1a64.shard_of(name.as_bytes(), count), want, "{name:?} over {count}");
            }
        }
        assert_eq!(fnv_1a_64(b"testfile"), 0xf31b_3179_4e08_f223);
    }

    #[test]
    fn shards_are_the_hash_modulo_the_count() {
        for name in ["a", "file.0001", "résumé", ""] {
            let h = fnv_1a_64(name.as_bytes());
            for count in 1..=8u32 {
                assert_eq!(DirHash::Fnv1a64.shard_of(name.as_bytes(), count) as u64, h % count as u64);
            }
        }
        // all_char: "ab" = 97 + 98 = 195.
        assert_eq!(DirHash::AllChar.shard_of(b"ab", 4), 195 % 4);
        assert_eq!(DirHash::AllChar.shard_of(b"ab", 1), 0);
    }

    #[test]
    fn names_parse_and_print_as_lustre_spells_them() {
        for h in [DirHash::Fnv1a64, DirHash::AllChar] {
            assert_eq!(DirHash::parse(h.name()), Ok(h));
        }
        assert!(DirHash::parse("crush").unwrap_err().contains("unknown directory hash type 'crush'"));
    }
}
