//! A cluster written by the release before versioned records (database format 0),
//! opened by this one: every file, attribute and layout reads back as it was, also
//! what the MDT had only in its journal when that release was killed, and the
//! upgraded cluster opens again.
//!
//! The fixture `data/format0-cluster.tar.gz` is the `--data` directory of
//! `braid local --osts 2` built at commit 55018a8, made with its FUSE mount:
//! `small.txt` ("hello braid\n", mode 0640, xattr `user.tag` = "v0", a second link
//! `d/hard2`), `striped/data.bin` (300 KiB of `(i * 7) % 251`, the directory striped
//! over 2 OSTs in 64 KiB stripes), `trunc.bin` (200,000 bytes of 0xab cut to
//! 100,000, owner 1000:1000), `d/link` → `../small.txt`, the FIFO `d/fifo`; then,
//! after a checkpoint, `late.txt` (fsynced) and the rename of `d/hard` to `d/hard2`,
//! and the process was killed with SIGKILL (so those two are only in the journal).

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use testkit::{LocalCluster, TempDir};

fn unpack_fixture(dir: &Path) {
    let data = dir.join("data");
    fs::create_dir_all(&data).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/format0-cluster.tar.gz");
    let st = Command::new("tar").arg("xzf").arg(&fixture).arg("-C").arg(&data).status().expect("run tar");
    assert!(st.success(), "tar xzf {}", fixture.display());
}

fn xattr(path: &Path, name: &str) -> Vec<u8> {
    let (c, n) = (CString::new(path.as_os_str().as_encoded_bytes()).unwrap(), CString::new(name).unwrap());
    let mut buf = vec![0u8; 64];
    // SAFETY: valid C strings and a buffer of the length passed.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "getxattr {name} on {}: {}", path.display(), std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf
}

fn check_fixture(mnt: &Path) {
    let small = mnt.join("small.txt");
    assert_eq!(fs::read(&small).unwrap(), b"hello braid\n");
    let m = fs::metadata(&small).unwrap();
    assert_eq!((m.permissions().mode() & 0o7777, m.nlink()), (0o640, 2));
    assert_eq!(xattr(&small, "user.tag"), b"v0");
    assert_eq!(fs::read(mnt.join("d/hard2")).unwrap(), b"hello braid\n");
    assert!(!mnt.join("d/hard").exists(), "the rename in the journal was replayed");
    assert_eq!(fs::read_link(mnt.join("d/link")).unwrap(), Path::new("../small.txt"));
    assert!(fs::symlink_metadata(mnt.join("d/fifo")).unwrap().file_type().is_fifo());

    let striped: Vec<u8> = (0..300 * 1024).map(|i| ((i * 7) % 251) as u8).collect();
    assert!(fs::read(mnt.join("striped/data.bin")).unwrap() == striped, "striped/data.bin differs");
    let trunc = mnt.join("trunc.bin");
    let m = fs::metadata(&trunc).unwrap();
    assert_eq!((m.len(), m.uid(), m.gid()), (100_000, 1000, 1000));
    assert!(fs::read(&trunc).unwrap().iter().all(|&b| b == 0xab));
    assert_eq!(fs::read(mnt.join("late.txt")).unwrap(), b"written just before the crash\n");
}

#[test]
fn a_cluster_of_format_0_is_read_whole_by_this_release_and_opens_again_after_the_upgrade() {
    let dir = TempDir::new("upgrade");
    unpack_fixture(dir.path());
    let bin = Path::new(env!("CARGO_BIN_EXE_braid"));
    {
        let c = LocalCluster::start(bin, dir.path(), &[]);
        check_fixture(&c.mnt);
        let out = Command::new(bin).args(["getstripe", c.mnt.join("striped/data.bin").to_str().unwrap()]).output();
        let text = String::from_utf8_lossy(&out.unwrap().stdout).to_string();
        assert!(text.contains("lmm_stripe_count:  2") && text.contains("lmm_stripe_size:   65536"), "{text}");
        fs::write(c.mnt.join("new.txt"), b"after the upgrade").unwrap();
        fs::create_dir(c.mnt.join("newdir")).unwrap();
    }
    let log = fs::read_to_string(dir.path().join("local.log")).unwrap_or_default();
    assert!(log.contains("upgraded the MDT from format 0"), "no MDT upgrade in the log:\n{log}");
    assert!(log.contains("upgraded the MGS registry from format 0"), "no MGS upgrade in the log:\n{log}");
    // Opened again: already of today's format, nothing to upgrade, nothing lost.
    let c = LocalCluster::start(bin, dir.path(), &[]);
    check_fixture(&c.mnt);
    assert_eq!(fs::read(c.mnt.join("new.txt")).unwrap(), b"after the upgrade");
    assert!(c.mnt.join("newdir").is_dir());
}
