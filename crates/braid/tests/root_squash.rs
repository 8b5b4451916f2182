//! Root squash (`braid mgs --root-squash`, Lustre's `root_squash` and
//! `nosquash_nids`) through real mounts of a cluster of separate processes: root on
//! an exempt client stays root; once the MGS squashes every client, root acts as
//! 65534:65534 in every check and in every file it makes: on the MDS (a CLI tool's
//! requests, which the client does not squash itself) and in what the mount answers
//! itself.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use testkit::{code, wait_for, Cluster, ClusterSpec, Mount};

const NOBODY: u32 = 65534;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// Runs `f` on a new thread whose file system uid and gid are `id` (raw per-thread
/// syscalls, so the rest of the test stays root).
fn as_user<T: Send + 'static>(id: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: raw per-thread credential syscalls with valid arguments.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()), 0);
            libc::syscall(libc::SYS_setfsgid, id);
            libc::syscall(libc::SYS_setfsuid, id);
        }
        f()
    })
    .join()
    .expect("user thread")
}

fn chmod(p: &Path, mode: u32) -> i32 {
    code(fs::set_permissions(p, fs::Permissions::from_mode(mode)))
}

fn chown(p: &Path, uid: u32, gid: u32) -> i32 {
    code(std::os::unix::fs::chown(p, Some(uid), Some(gid)))
}

#[test]
fn root_on_a_squashed_client_acts_as_the_squash_user() {
    let squash = ["--root-squash", "65534:65534", "--nosquash-nids", "10.9.9.0/24, 127.0.0.1"];
    let spec = ClusterSpec { mgs_args: squash.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let mut c = Cluster::start(bin(), spec);
    let m = Mount::new(&c, "allow_other");

    // Exempt: root is root (it may give files away and make them private).
    fs::create_dir(m.path("open")).unwrap();
    assert_eq!(chmod(&m.path("open"), 0o777), 0);
    fs::create_dir(m.path("home")).unwrap();
    fs::write(m.path("home/f"), b"f").unwrap();
    fs::write(m.path("secret"), b"s").unwrap();
    fs::write(m.path("public"), b"p").unwrap();
    for p in ["home", "home/f", "secret"] {
        assert_eq!(chown(&m.path(p), 1000, 1000), 0, "chown {p} by exempt root");
    }
    assert_eq!(chmod(&m.path("secret"), 0o600), 0);
    File::create(m.path("open/by-root")).unwrap();
    assert_eq!(fs::metadata(m.path("open/by-root")).unwrap().uid(), 0);
    c.braid_ok(&["setstripe", "-c", "1", &c.url("/open/cli-exempt")]);
    assert_eq!(fs::metadata(m.path("open/cli-exempt")).unwrap().uid(), 0);

    // The MGS now squashes every client: the MDS and the mount learn it from the
    // configuration they refresh.
    c.edit_args("mgs", |a| {
        let i = a.iter().position(|a| a == "--nosquash-nids").expect("nosquash flag");
        a.drain(i..i + 2);
    });
    c.restart("mgs");
    let mut n = 0;
    wait_for("the MDS to squash root", Duration::from_secs(30), || {
        n += 1;
        let name = format!("/open/cli-{n}");
        let made = c.braid(&["setstripe", "-c", "1", &c.url(&name)]);
        made.status.success() && fs::metadata(m.path(&name[1..])).is_ok_and(|a| a.uid() == NOBODY)
    });
    // The mount learns it at its next look at the configuration: until then it
    // answers root's unlink in a directory it holds the lease on itself (and the
    // MDS refuses it afterwards).
    wait_for("the mount to squash root", Duration::from_secs(30), || {
        n += 1;
        let (dir, file) = (m.path(&format!("open/probe-{n}")), m.path(&format!("open/probe-{n}/f")));
        let made = file.clone();
        as_user(1000, move || {
            fs::create_dir(&dir).unwrap();
            fs::write(&made, b"1000").unwrap();
        });
        code(fs::remove_file(&file)) == libc::EACCES
    });

    // What root makes is nobody's, as the MDS recorded it (a fresh mount asks it),
    // also inside a directory the mount made and holds the lease on, where it
    // answers creates itself.
    File::create(m.path("open/new")).unwrap();
    fs::create_dir(m.path("open/mine")).unwrap();
    for f in ["a", "b", "c", "d", "e"] {
        fs::write(m.path(&format!("open/mine/{f}")), f).unwrap();
        // Time for the grant of FIDs the mount asks for at its first create here.
        std::thread::sleep(Duration::from_millis(100));
    }
    let fresh = Mount::new(&c, "");
    for p in ["open/new", "open/mine", "open/mine/a", "open/mine/b", "open/mine/e"] {
        let (here, there) = (fs::metadata(m.path(p)).unwrap(), fs::metadata(fresh.path(p)).unwrap());
        assert_eq!((there.uid(), there.gid()), (NOBODY, NOBODY), "{p} as the MDS has it");
        assert_eq!((here.uid(), here.gid()), (NOBODY, NOBODY), "{p} as the mount shows it");
    }
    drop(fresh);
    // In a directory another user of this mount made (the mount holds its lease),
    // the kernel lets root unlink, the MDS does not: the mount must not answer the
    // unlink itself.
    let (dir, file) = (m.path("open/u1000"), m.path("open/u1000/f"));
    as_user(1000, move || {
        fs::create_dir(&dir).unwrap();
        fs::write(&file, b"1000").unwrap();
    });
    assert_eq!(code(fs::remove_file(m.path("open/u1000/f"))), libc::EACCES, "unlink in another user's directory");
    assert_eq!(fs::read(m.path("open/u1000/f")).unwrap(), b"1000");
    assert_eq!(code(fs::remove_file(m.path("open/mine/a"))), 0, "unlink in its own directory");

    // Root has no privilege left: other users' bits apply to it.
    let eacces = libc::EACCES;
    assert_eq!(code(File::open(m.path("secret"))), eacces, "read another user's private file");
    assert_eq!(code(fs::create_dir(m.path("home/d"))), eacces, "mkdir in another user's 0755 directory");
    assert_eq!(code(File::create(m.path("home/g"))), eacces, "create in another user's 0755 directory");
    assert_eq!(code(fs::remove_file(m.path("home/f"))), eacces, "unlink in another user's directory");
    assert_eq!(fs::read(m.path("home/f")).unwrap(), b"f", "the refused unlink left the file");
    let cli = c.braid(&["setstripe", "-c", "1", &c.url("/home/cli")]);
    assert!(!cli.status.success(), "a CLI create in another user's directory is refused by the MDS");
    assert_eq!(chown(&m.path("open/new"), 0, 0), libc::EPERM, "chown needs privilege");
    assert_eq!(chown(&m.path("home/f"), NOBODY, NOBODY), libc::EPERM, "chown of another user's file");
    assert_eq!(chown(&m.path("home/f"), 1000, 1000), libc::EPERM, "chown of another user's file to its owner");
    assert_eq!(chmod(&m.path("public"), 0o777), libc::EPERM, "chmod of root's file by squashed root");
    // What others may do, it may do.
    assert_eq!(fs::read(m.path("public")).unwrap(), b"p");
    assert_eq!(code(fs::remove_file(m.path("open/by-root"))), 0, "unlink in a 0777 directory");
    assert_eq!(chmod(&m.path("open/new"), 0o600), 0, "chmod of its own file");
}
