//! readdir through a real mount: a directory of 100,000 entries lists completely and
//! exactly once, and entries created during a listing do not make it skip or repeat.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use testkit::{Cluster, ClusterSpec, Mount};

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn listing_survives_concurrent_creates() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    let orig: Vec<String> = (0..3000).map(|i| format!("f{i:05}")).collect();
    for n in &orig {
        fs::File::create(d.join(n)).unwrap();
    }
    let mut it = fs::read_dir(&d).unwrap();
    let mut seen = Vec::new();
    for _ in 0..1000 {
        seen.push(it.next().unwrap().unwrap().file_name().to_string_lossy().into_owned());
    }
    // Create entries sorting before, between and after those already listed.
    for i in 0..500 {
        for p in ["a", "f0", "z"] {
            fs::File::create(d.join(format!("{p}new{i}"))).unwrap();
        }
    }
    seen.extend(it.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()));
    let set: HashSet<&String> = seen.iter().collect();
    assert_eq!(set.len(), seen.len(), "no entry listed twice");
    let missing: Vec<&String> = orig.iter().filter(|n| !set.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{} original entries skipped, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(names(&d).len(), 3000 + 1500, "a fresh listing shows everything");
}

#[test]
#[ignore = "slow: 100,000 creates through FUSE took over 6 minutes on a 2-core shared machine; run with --ignored"]
fn directory_of_100000_entries() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    fs::create_dir(m.path("big")).unwrap();
    const N: usize = 100_000;
    const THREADS: usize = 8;
    // Created through the mount by several threads (mknod: create without open).
    let dir = m.path("big");
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                for i in (t..N).step_by(THREADS) {
                    let p = std::ffi::CString::new(dir.join(format!("e{i:06}")).into_os_string().into_encoded_bytes())
                        .unwrap();
                    // SAFETY: valid C string.
                    let r = unsafe { libc::mknod(p.as_ptr(), libc::S_IFREG | 0o644, 0) };
                    assert_eq!(r, 0, "mknod e{i}: {}", std::io::Error::last_os_error());
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let listed = names(&dir);
    assert_eq!(listed.len(), N, "every entry listed");
    let set: HashSet<&String> = listed.iter().collect();
    assert_eq!(set.len(), N, "no entry listed twice");
    assert!((0..N).all(|i| set.contains(&format!("e{i:06}"))), "the listed names are the created ones");
    assert_eq!(fs::metadata(dir.join("e099999")).unwrap().len(), 0);
}
