//! The cache on a real directory: fills and hits, invalidation and versions, eviction
//! within the size, and what survives a reopen, a torn index and damaged data.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cache::{Cache, CacheConfig, CacheError};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("braid-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Dir(d)
}

/// The cache file holding file `key`'s bytes (at their own offsets).
fn cache_file(d: &Path, key: u128) -> PathBuf {
    let prefix = format!("{key:032x}.");
    std::fs::read_dir(d.join("files"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .expect("a cache file of the key")
}

fn open(d: &Path, size: u64) -> Cache {
    Cache::open(&CacheConfig { dir: d.to_path_buf(), size }, 7).expect("open cache")
}

/// `len` pseudo-random bytes (xorshift), different for each seed and never periodic
/// within a test's sizes.
fn bytes(len: usize, seed: u8) -> Bytes {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Fills `data` at `off` of file `key` (version `v`) and waits for it to land.
fn fill(c: &Cache, key: u128, v: u64, off: u64, data: &Bytes) {
    let t = c.ticket(key, v);
    c.fill(t, off, data.clone());
    c.settle();
}

#[test]
fn a_filled_range_is_read_back_whole_or_in_part_and_nothing_else_is() {
    let d = dir("hits");
    let c = open(&d.0, 8 << 20);
    let data = bytes(300_000, 1);
    assert!(c.read(1, 0, 1000, 10).is_none(), "nothing cached yet");
    fill(&c, 1, 0, 1000, &data);
    assert_eq!(c.read(1, 0, 1000, 300_000).unwrap(), data);
    assert_eq!(c.read(1, 0, 5000, 7).unwrap(), data.slice(4000..4007), "a part, not page aligned");
    assert_eq!(c.read(1, 0, 290_000, 11_000).unwrap(), data.slice(289_000..300_000), "up to the end");
    assert!(c.read(1, 0, 999, 10).is_none(), "one byte before");
    assert!(c.read(1, 0, 300_999, 2).is_none(), "one byte after");
    assert!(c.read(2, 0, 1000, 10).is_none(), "another file");
    assert!(c.read(1, 1, 1000, 10).is_none(), "another version");
    // Two adjacent fills serve one read across both.
    let more = bytes(5000, 2);
    fill(&c, 1, 0, 301_000, &more);
    let got = c.read(1, 0, 300_000, 2000).unwrap();
    assert_eq!(&got[..1000], &data[299_000..]);
    assert_eq!(&got[1000..], &more[..1000]);
    let s = c.stats();
    assert_eq!((s.hits, s.fills, s.fill_bytes), (4, 2, 305_000));
    assert!(s.misses == 5 && s.used >= 305_000 && s.used < 305_000 + 3 * 4096, "{s:?}");
}

#[test]
fn writes_and_newer_versions_drop_cached_bytes_and_stale_fills_are_refused() {
    let d = dir("coherence");
    let c = open(&d.0, 8 << 20);
    let data = bytes(200_000, 3);
    fill(&c, 7, 4, 0, &data);
    // A write through this client drops what it touches, nothing else.
    c.invalidate(7, 100_000, 10);
    assert!(c.read(7, 4, 100_000, 10).is_none());
    let s = c.stats();
    assert!(s.invalidations >= 1);
    // A fill of a read taken before a write is refused: it may hold the old bytes.
    let before = c.ticket(7, 4);
    c.invalidate(7, 0, 1);
    c.fill(before, 0, data.clone());
    c.settle();
    assert!(c.read(7, 4, 0, 10).is_none(), "a fill older than a write is refused");
    // A fill taken after it lands.
    fill(&c, 7, 4, 0, &data);
    assert_eq!(c.read(7, 4, 0, 10).unwrap(), data.slice(0..10));
    // An open of a newer version drops the file's bytes; an older one changes nothing.
    c.opened(7, 3);
    assert!(c.read(7, 4, 0, 10).is_some());
    c.opened(7, 5);
    assert!(c.read(7, 4, 0, 10).is_none() && c.read(7, 5, 0, 10).is_none());
    // A fill of the older version after that is refused.
    fill(&c, 7, 4, 0, &data);
    fill(&c, 7, 5, 0, &data.slice(0..100));
    fill(&c, 7, 4, 0, &data);
    assert!(c.read(7, 4, 0, 10).is_none(), "older than what the cache holds");
    assert_eq!(c.read(7, 5, 0, 100).unwrap(), data.slice(0..100));
    c.clear().unwrap();
    assert!(c.read(7, 5, 0, 100).is_none());
    assert_eq!(c.stats().used, 0);
}

#[test]
fn the_cache_never_passes_its_size_and_evicts_the_least_recently_used() {
    let d = dir("evict");
    let size = 4 << 20;
    let c = open(&d.0, size);
    let mb = bytes(1 << 20, 5);
    for key in 0..4u128 {
        fill(&c, key, 0, 0, &mb);
    }
    assert_eq!(c.stats().used, size);
    // File 0 read again: the least recently used is now file 1.
    assert!(c.read(0, 0, 0, 10).is_some());
    fill(&c, 9, 0, 0, &mb);
    let s = c.stats();
    assert!(s.used <= size, "{s:?}");
    assert_eq!(s.evictions, 1);
    assert!(c.read(0, 0, 0, 10).is_some(), "recently read: kept");
    assert!(c.read(1, 0, 0, 10).is_none(), "least recently used: evicted");
    // Many small extents and big ones mixed: never over the size, everything served
    // is right.
    for i in 0..200u64 {
        let len = [4096usize, 100, 70_000, 1 << 20, 300_000][i as usize % 5];
        let v = bytes(len, i as u8);
        fill(&c, 100 + i as u128, 0, i * 7, &v);
        assert!(c.stats().used <= size);
        if let Some(got) = c.read(100 + i as u128, 0, i * 7, len as u64) {
            assert_eq!(got, v);
        }
    }
}

#[test]
fn the_index_survives_a_reopen_a_torn_tail_and_damaged_data_is_never_served() {
    let d = dir("persist");
    let data = bytes(500_000, 9);
    {
        let c = open(&d.0, 8 << 20);
        fill(&c, 3, 2, 4096, &data);
        fill(&c, 4, 1, 0, &data.slice(0..1000));
    }
    // Reopened: served again without any fill.
    {
        let c = open(&d.0, 8 << 20);
        assert_eq!(c.read(3, 2, 4096, 500_000).unwrap(), data);
        assert_eq!(c.stats().fills, 0);
    }
    // A torn tail (half a frame, as a killed client leaves): cut off, the rest kept.
    let log = d.0.join("index.log");
    let f = OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all_at(&[200, 0, 0, 0, 1, 2, 3], 0).unwrap();
    {
        let c = open(&d.0, 8 << 20);
        assert_eq!(c.read(3, 2, 4096, 100).unwrap(), data.slice(0..100));
        fill(&c, 5, 0, 0, &data.slice(0..10));
    }
    {
        let c = open(&d.0, 8 << 20);
        assert!(c.read(5, 0, 0, 10).is_some(), "appended after the cut and kept");
    }
    // A page of data changed behind the cache's back: dropped, never served.
    let datafile = cache_file(&d.0, 3);
    let raw = std::fs::read(&datafile).unwrap();
    let at = 4096 + 200_000;
    assert_eq!(&raw[at..at + 16], &data[200_000..200_016], "the bytes are at their own offset");
    let df = OpenOptions::new().write(true).open(&datafile).unwrap();
    df.write_all_at(&[raw[at] ^ 0xff], at as u64).unwrap();
    let c = open(&d.0, 8 << 20);
    assert!(c.read(3, 2, 4096 + 200_000, 16).is_none(), "damaged: a miss");
    assert_eq!(c.stats().damaged, 1);
    assert!(c.read(3, 2, 4096, 100).is_none(), "the damaged extent went whole");
    assert_eq!(c.read(4, 1, 0, 1000).unwrap(), data.slice(0..1000), "other extents stay");
    drop(c);
    // Another cluster (FIDs repeat across clusters): the cache starts empty.
    let c = Cache::open(&CacheConfig { dir: d.0.clone(), size: 8 << 20 }, 8).unwrap();
    assert!(c.read(4, 1, 0, 1000).is_none());
    drop(c);
    // Another size: the cache starts empty rather than misread.
    let c = open(&d.0, 16 << 20);
    assert!(c.read(4, 1, 0, 1000).is_none());
    assert_eq!(c.stats().size, 16 << 20);
}

#[test]
fn a_read_across_extents_is_answered_whole_and_a_damaged_one_spoils_it() {
    let d = dir("across");
    let c = open(&d.0, 16 << 20);
    // Extents meeting at page boundaries (read into one buffer), the last one short.
    let data = bytes((2 << 20) + 8192 + 5000, 21);
    let cut = [0usize, 1 << 20, (2 << 20) + 8192, data.len()];
    for w in cut.windows(2) {
        fill(&c, 10, 1, w[0] as u64, &data.slice(w[0]..w[1]));
    }
    let len = data.len() as u64 - 100;
    assert_eq!(c.read(10, 1, 100, len).unwrap(), data.slice(100..));
    assert_eq!(c.read_ahead(10, 1, 100, len).unwrap(), data.slice(100..), "the prefetcher's read");
    assert_eq!(c.read(10, 1, (1 << 20) - 10, 20).unwrap(), data.slice((1 << 20) - 10..(1 << 20) + 10));
    // Extents that meet inside a page (read one by one and joined by a copy).
    let small = bytes(20_000, 22);
    fill(&c, 11, 1, 0, &small.slice(0..5000));
    fill(&c, 11, 1, 5000, &small.slice(5000..));
    assert_eq!(c.read(11, 1, 10, 19_980).unwrap(), small.slice(10..19_990));
    assert_eq!(c.read_ahead(11, 1, 0, 20_000).unwrap(), small);
    // One byte of the middle extent changed: the read across it is a miss.
    let datafile = cache_file(&d.0, 10);
    let raw = std::fs::read(&datafile).unwrap();
    let mid = (1 << 20) + 300_000;
    let at = mid;
    assert_eq!(&raw[at..at + 16], &data[mid..mid + 16]);
    OpenOptions::new().write(true).open(&datafile).unwrap().write_all_at(&[raw[at] ^ 1], at as u64).unwrap();
    assert!(c.read_ahead(10, 1, 0, data.len() as u64).is_none(), "damaged: a miss");
    assert_eq!(c.stats().damaged, 1);
    assert_eq!(c.read(10, 1, 0, 1 << 20).unwrap(), data.slice(..1 << 20), "the first extent stays");
    assert!(c.read(10, 1, 1 << 20, 10).is_none(), "the damaged one went");
}

/// `dir` made read-only for this process until dropped: bound read-only onto itself
/// as root (whom file modes do not stop), its and its lock file's write bits cleared
/// otherwise.
struct ReadOnly(PathBuf, bool);

impl ReadOnly {
    fn new(dir: &Path) -> ReadOnly {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            let path = dir.to_str().expect("a UTF-8 path");
            for args in [&["--bind", path, path][..], &["-o", "remount,bind,ro", path]] {
                let st = std::process::Command::new("mount").args(args).status().expect("run mount");
                if !st.success() {
                    let _ = std::process::Command::new("umount").arg(path).status();
                    panic!("mount {args:?}: {st}");
                }
            }
        } else {
            set_mode(dir, 0o555);
            set_mode(&dir.join("lock"), 0o444);
        }
        ReadOnly(dir.to_path_buf(), root)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        } else {
            set_mode(&self.0, 0o755);
            set_mode(&self.0.join("lock"), 0o644);
        }
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_busy_missing_or_read_only_directory_is_a_clear_error() {
    let d = dir("busy");
    let cfg = |dir: &Path, size| CacheConfig { dir: dir.to_path_buf(), size };
    let c = open(&d.0, 2 << 20);
    match Cache::open(&cfg(&d.0, 2 << 20), 7) {
        Err(e @ CacheError::Busy(_)) => {
            assert_eq!(e.to_string(), format!("cache directory {} is in use by another braid client", d.0.display()))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second client opened a cache in use"),
    }
    drop(c);
    let e = Cache::open(&cfg(&d.0, 1000), 7).err().expect("too small");
    assert!(matches!(e, CacheError::TooSmall(1000)), "{e:?}");
    assert_eq!(e.to_string(), format!("cache size 1000 is below the smallest cache ({} bytes)", cache::MIN_SIZE));

    // A directory that cannot be made.
    let e = Cache::open(&cfg(Path::new("/proc/braid-no-cache"), 2 << 20), 7).err().expect("no directory");
    assert!(matches!(&e, CacheError::Io { what: "create", .. }), "{e:?}");
    assert_eq!(e.to_string(), "cache directory /proc/braid-no-cache: create: No such file or directory (os error 2)");

    // Read-only: a cache directory used before, and a new one to be made in it.
    let ro = ReadOnly::new(&d.0);
    for (dir, what) in [(d.0.clone(), "open lock"), (d.0.join("new"), "create")] {
        let e = Cache::open(&cfg(&dir, 2 << 20), 7).err().expect("a read-only directory");
        let CacheError::NotWritable { what: failed, source, .. } = &e else { panic!("{e:?}") };
        assert_eq!(*failed, what, "{e}");
        let want = if ro.1 { ErrorKind::ReadOnlyFilesystem } else { ErrorKind::PermissionDenied };
        assert_eq!(source.kind(), want, "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "cache directory {} is not writable ({what}: {source}); the cache needs a directory it can write",
                dir.display()
            )
        );
    }
    drop(ro);
    drop(open(&d.0, 2 << 20));

    assert_eq!(cache::parse_size("20G"), Some(20 << 30));
    assert_eq!(cache::parse_size("512m"), Some(512 << 20));
    assert_eq!(cache::parse_size("4096"), Some(4096));
    assert_eq!(cache::parse_size("x"), None);
    assert_eq!(cache::parse_size("99999999999T"), None);
}

#[test]
fn a_file_held_whole_and_checked_is_handed_out_as_its_own_backing_file() {
    use cache::Refused;
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let d = dir("backing");
    let data = bytes(3 * (1 << 20) + 5000, 31);
    let size = data.len() as u64;
    {
        let c = open(&d.0, 16 << 20);
        fill(&c, 40, 2, 0, &data.slice(..1 << 20));
        assert_eq!(c.backing(40, 2, size).err(), Some(Refused::Incomplete), "a part only");
        fill(&c, 40, 2, 1 << 20, &data.slice(1 << 20..));
        assert_eq!(c.backing(40, 2, size + 1).err(), Some(Refused::Incomplete), "shorter than the file");
        assert_eq!(c.backing(40, 3, size).err(), Some(Refused::Incomplete), "another version");
        let b = c.backing(40, 2, size).expect("held whole");
        let mut got = Vec::new();
        (&b.file).read_to_end(&mut got).unwrap();
        assert!(got == data, "the backing file is the file, byte for byte, and no longer");
        // Held: not evicted to make room for others, and a change through this client
        // makes the cache let go of it while the holder keeps its bytes.
        for key in 100..120u128 {
            fill(&c, key, 0, 0, &data.slice(..1 << 20));
        }
        assert!(c.read(40, 2, 0, size).is_some(), "a held file is not evicted");
        assert!(c.stats().used <= 16 << 20);
        c.invalidate(40, 10, 1);
        assert!(c.read(40, 2, 0, 100).is_none(), "let go of");
        let mut again = Vec::new();
        let mut f = &b.file;
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut again).unwrap();
        assert!(again == data, "the holder's bytes stay");
        drop(b);
        fill(&c, 41, 1, 0, &data);
        assert!(c.backing(41, 1, size).is_ok());
    }
    // Reopened: the bytes are served again, but not handed out before a read checked them.
    let c = open(&d.0, 16 << 20);
    assert_eq!(c.backing(41, 1, size).err(), Some(Refused::Unchecked));
    // A read of part of an extent checks the rest of it too.
    for mb in 0..4u64 {
        let at = (mb << 20) + 4000;
        assert_eq!(c.read(41, 1, at, 10).unwrap(), data.slice(at as usize..at as usize + 10));
        if mb < 3 {
            assert_eq!(c.backing(41, 1, size).err(), Some(Refused::Unchecked));
        }
    }
    assert!(c.backing(41, 1, size).is_ok(), "checked by the reads");
    // Changed behind the cache's back (with the same bytes even): refused, checked again.
    let path = cache_file(&d.0, 41);
    let raw = std::fs::read(&path).unwrap();
    OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&raw[..10], 0).unwrap();
    assert_eq!(c.backing(41, 1, size).err(), Some(Refused::Changed));
    assert_eq!(c.backing(41, 1, size).err(), Some(Refused::Unchecked));
    assert_eq!(c.read(41, 1, 0, size).unwrap(), data);
    assert!(c.backing(41, 1, size).is_ok());
    // Dropped bytes are punched out of the cache file, not only forgotten.
    let before = std::fs::metadata(&path).unwrap().blocks();
    c.invalidate(41, 0, 2 << 20);
    c.settle();
    let after = std::fs::metadata(&path).unwrap().blocks();
    assert!(after * 512 <= before * 512 - (2 << 20), "{before} -> {after} blocks");
    assert_eq!(c.read(41, 1, 2 << 20, 100).unwrap(), data.slice(2 << 20..(2 << 20) + 100));
}

#[test]
fn fills_of_held_bytes_are_skipped_and_overlapping_ones_keep_the_rest_held() {
    let d = dir("overlap");
    let c = open(&d.0, 16 << 20);
    let data = bytes(4 << 20, 51);
    // A read-ahead's chunk, then the read it served: the second is held already.
    fill(&c, 60, 1, 0, &data.slice(..2 << 20));
    fill(&c, 60, 1, 0, &data.slice(..128 << 10));
    assert_eq!(c.stats().fills, 1, "nothing written twice");
    // A fill reaching past what is held takes over its overlap; the rest stays held.
    fill(&c, 60, 1, (1 << 20) + 4096, &data.slice((1 << 20) + 4096..3 << 20));
    fill(&c, 60, 1, 3 << 20, &data.slice(3 << 20..));
    assert_eq!(c.read(60, 1, 0, 4 << 20).unwrap(), data, "every byte held, each right");
    assert!(c.backing(60, 1, 4 << 20).is_ok(), "held whole");
    assert!(c.stats().used <= (4 << 20) + 2 * 4096, "{:?}", c.stats());
}
