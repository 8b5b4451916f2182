//! Operations that change a file's size or cut its contents, through real FUSE mounts,
//! while writes to the file are still unpublished (no close or fsync yet): truncate
//! and ftruncate, `O_TRUNC` opens, hole punch and zero range, and the same with the
//! writer on another client. Each checks that the cut range reads back as zeros, also
//! after the kernel's caches are dropped and the file is opened again.
//!
//! The bug these guard against: the MDS's size lags a file open for writing (writers
//! publish it at close and fsync), and a truncate that decided from that size which
//! objects to cut left the old bytes on the OSTs, where a later extension of the file
//! brought them back.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use testkit::{pattern, Mount, MountedCluster};

/// The tests of this file run one at a time. They keep writes unpublished on purpose,
/// and a descriptor open in this process is flushed (published) by the kernel whenever
/// any thread's child process execs (its close-on-exec copy of the descriptor is
/// closed, and a close flushes): a sibling test starting `braid mount` or `braid
/// setstripe` meanwhile would publish a write the test means to keep unpublished.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where the old bytes were cut to, and where the write past the end goes.
const CUT: u64 = 4096;
const FAR: u64 = 200_000;
const OLD_LEN: usize = 256 << 10;

/// A cluster and one mount, with directory `d` striped over all 4 OSTs in 64 KiB
/// stripes, so a cut spans several objects of different sizes.
fn start(opts: &str) -> MountedCluster {
    let e = MountedCluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), opts);
    let m = &e.m;
    fs::create_dir(m.path("d")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(["setstripe", "-c", "4", "-S", "65536", m.path("d").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    e
}

fn drop_caches() {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (the tests run as root)");
}

/// Checks `path` holds `OLD_LEN` bytes cut to `CUT`, then one byte `1` at `FAR`:
/// the old bytes below the cut, zeros up to `FAR`. Checked as read now and after the
/// caches are dropped and the file is opened again.
#[track_caller]
fn check_cut_then_extended(path: &Path, old: &[u8], what: &str) {
    for pass in ["as read at once", "after dropping the caches"] {
        if pass != "as read at once" {
            drop_caches();
        }
        let got = fs::read(path).unwrap();
        assert_eq!(got.len() as u64, FAR + 1, "{what}, {pass}: size");
        assert!(got[..CUT as usize] == old[..CUT as usize], "{what}, {pass}: the bytes below the cut changed");
        let stale = got[CUT as usize..FAR as usize].iter().filter(|&&b| b != 0).count();
        assert_eq!(stale, 0, "{what}, {pass}: {stale} old bytes came back between the cut and the new write");
        assert_eq!(got[FAR as usize], 1, "{what}, {pass}: the byte written past the end");
    }
}

#[test]
fn a_cut_of_unpublished_writes_reads_back_as_zeros() {
    let _serial = serial();
    let e = start("");
    let old = pattern(OLD_LEN, 31);

    // ftruncate with the writes still unpublished, then a write past the end.
    let p = e.m.path("d/ftruncate");
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    f.write_all_at(&old, 0).unwrap();
    f.set_len(CUT).unwrap();
    f.write_all_at(&[1], FAR).unwrap();
    drop(f);
    check_cut_then_extended(&p, &old, "ftruncate");

    // truncate(path) while the writing descriptor is open.
    let p = e.m.path("d/truncate");
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    f.write_all_at(&old, 0).unwrap();
    // SAFETY: truncate(2) of a NUL-terminated path.
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), CUT as i64) }, 0);
    f.write_all_at(&[1], FAR).unwrap();
    drop(f);
    check_cut_then_extended(&p, &old, "truncate(path)");

    // O_TRUNC open of a file another descriptor wrote and has not closed: everything
    // goes, the bytes below the cut too.
    let p = e.m.path("d/otrunc");
    let writer = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    writer.write_all_at(&old, 0).unwrap();
    let again = OpenOptions::new().write(true).truncate(true).open(&p).unwrap();
    again.write_all_at(&old[..CUT as usize], 0).unwrap();
    again.write_all_at(&[1], FAR).unwrap();
    drop(again);
    drop(writer);
    check_cut_then_extended(&p, &old, "O_TRUNC open");
}

#[test]
fn hole_punch_and_zero_range_of_unpublished_writes() {
    let _serial = serial();
    let e = start("");
    let old = pattern(OLD_LEN, 32);
    let p = e.m.path("d/ranges");
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    f.write_all_at(&old, 0).unwrap();
    let fd = f.as_raw_fd();
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open descriptor.
    let punched = unsafe { libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | keep, 10_000, 50_000) };
    assert_eq!(punched, 0, "punch hole: {}", std::io::Error::last_os_error());
    // SAFETY: as above.
    let zeroed = unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE | keep, 100_000, 60_000) };
    assert_eq!(zeroed, 0, "zero range: {}", std::io::Error::last_os_error());
    assert_eq!(f.metadata().unwrap().len(), OLD_LEN as u64, "KEEP_SIZE keeps the size");
    // Zero range past the end without KEEP_SIZE grows the file with zeros.
    // SAFETY: as above.
    let grown = unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, OLD_LEN as i64 - 1000, 11_000) };
    assert_eq!(grown, 0, "zero range past the end: {}", std::io::Error::last_os_error());
    assert_eq!(f.metadata().unwrap().len(), OLD_LEN as u64 + 10_000);
    drop(f);
    let mut want = old.clone();
    want[10_000..60_000].fill(0);
    want[100_000..160_000].fill(0);
    want[OLD_LEN - 1000..].fill(0);
    want.resize(OLD_LEN + 10_000, 0);
    for pass in ["at once", "after dropping the caches"] {
        if pass != "at once" {
            drop_caches();
        }
        let got = fs::read(&p).unwrap();
        assert_eq!(got.len(), want.len(), "{pass}: size");
        let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(wrong, 0, "{pass}: {wrong} bytes differ from the punched and zeroed file");
    }
    // COLLAPSE_RANGE and INSERT_RANGE are refused, changing nothing.
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for mode in [libc::FALLOC_FL_COLLAPSE_RANGE, libc::FALLOC_FL_INSERT_RANGE] {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), mode, 0, 65536) }, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));
    }
    assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
}

#[test]
fn a_truncate_on_one_client_cuts_what_another_wrote_and_has_not_published() {
    let _serial = serial();
    let e = start("");
    // The writer reads through `direct_io`, so its read-back below reaches the client,
    // which answers only once the writes of that range are on the OSTs: the cut then
    // comes after them for sure (write-behind across clients is not ordered by locks).
    let other = Mount::new(&e.c, "direct_io");
    let old = pattern(OLD_LEN, 33);
    let p = other.path("d/shared");
    let w = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    w.write_all_at(&old, 0).unwrap();
    let mut back = vec![0u8; OLD_LEN];
    w.read_exact_at(&mut back, 0).unwrap();
    assert!(back == old, "the writer reads its own bytes");
    assert_eq!(fs::metadata(e.m.path("d/shared")).unwrap().size(), 0, "nothing published yet");

    let c = std::ffi::CString::new(e.m.path("d/shared").to_str().unwrap()).unwrap();
    // SAFETY: truncate(2) of a NUL-terminated path.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), CUT as i64) }, 0);
    w.write_all_at(&[1], FAR).unwrap();
    drop(w);
    check_cut_then_extended(&e.m.path("d/shared"), &old, "truncate on another client");

    // A writer that closes after the cut without writing again must not bring the
    // size it knew back (its close reports what the objects hold under the new epoch).
    let p = other.path("d/shrunk");
    let w = OpenOptions::new().read(true).write(true).create_new(true).open(&p).unwrap();
    w.write_all_at(&old, 0).unwrap();
    w.read_exact_at(&mut back, 0).unwrap();
    let c = std::ffi::CString::new(e.m.path("d/shrunk").to_str().unwrap()).unwrap();
    // SAFETY: truncate(2) of a NUL-terminated path.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), CUT as i64) }, 0);
    drop(w);
    drop_caches();
    let got = fs::read(e.m.path("d/shrunk")).unwrap();
    assert_eq!(got.len() as u64, CUT, "the writer's close kept the cut size");
    assert!(got[..] == old[..CUT as usize]);
    drop(other);

    // And no object keeps more than the file needs: every stripe object is cut.
    let stored: u64 =
        (0..4).flat_map(|i| e.c.ost_objects(i)).map(|o| fs::metadata(o).map(|m| m.len()).unwrap_or(0)).sum();
    assert!(stored <= FAR + 1, "objects hold {stored} bytes for a file of {} bytes", FAR + 1);
}

#[test]
fn cuts_of_a_file_replaced_or_unlinked_while_open() {
    let _serial = serial();
    let e = start("");
    let old = pattern(OLD_LEN, 34);
    // Checks what `f` reads now: the old bytes below the cut, zeros up to FAR, a 1.
    let check_handle = |f: &fs::File, what: &str| {
        let mut got = vec![0u8; FAR as usize + 1];
        f.read_exact_at(&mut got, 0).unwrap();
        assert!(got[..CUT as usize] == old[..CUT as usize], "{what}: the bytes below the cut changed");
        let stale = got[CUT as usize..FAR as usize].iter().filter(|&&b| b != 0).count();
        assert_eq!(stale, 0, "{what}: {stale} old bytes came back");
        assert_eq!(got[FAR as usize], 1, "{what}: the byte written past the end");
        assert_eq!(f.metadata().unwrap().len(), FAR + 1, "{what}: size");
    };

    // A rename replaces a file whose writes are unpublished: the open handle keeps the
    // replaced file (an orphan now) and cuts it; the name shows the new file, whole.
    let victim = e.m.path("d/victim");
    let a = OpenOptions::new().read(true).write(true).create_new(true).open(&victim).unwrap();
    a.write_all_at(&old, 0).unwrap();
    fs::write(e.m.path("d/new"), b"the new file").unwrap();
    fs::rename(e.m.path("d/new"), &victim).unwrap();
    a.set_len(CUT).unwrap();
    a.write_all_at(&[1], FAR).unwrap();
    check_handle(&a, "the replaced file through its handle");
    drop(a);
    assert_eq!(fs::read(&victim).unwrap(), b"the new file", "the name holds the file renamed onto it");

    // The same for a file unlinked while open.
    let gone = e.m.path("d/gone");
    let b = OpenOptions::new().read(true).write(true).create_new(true).open(&gone).unwrap();
    b.write_all_at(&old, 0).unwrap();
    fs::remove_file(&gone).unwrap();
    b.set_len(CUT).unwrap();
    b.write_all_at(&[1], FAR).unwrap();
    check_handle(&b, "an unlinked file through its handle");
    drop(b);
    assert_eq!(fs::read_dir(e.m.path("d")).unwrap().count(), 1, "only the renamed-onto file is left");
    testkit::wait_for("the orphans' objects to be destroyed", std::time::Duration::from_secs(90), || {
        (0..4).flat_map(|i| e.c.ost_objects(i)).count() == 1
    });
}
