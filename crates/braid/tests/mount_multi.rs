//! Locks and several clients: POSIX (fcntl) and BSD (flock) locks through one mount
//! and across two mounts of one cluster (two `braid mount` processes), a dying client
//! releasing its locks, close-to-open consistency, disjoint writes at any alignment
//! (IO500 ior-hard's 47,008-byte records), and attribute changes crossing clients
//! (times set through a descriptor after its writes, as `tar` sets them, and a file
//! renamed over a name another client still caches, included).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use testkit::{last_errno, pattern, wait_for, Cluster, ClusterSpec, LocalCluster, Mount};

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

fn flock_t(typ: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is plain data.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// fcntl(F_SETLK/F_SETLKW/F_GETLK); 0 or the errno.
fn fcntl_lock(fd: i32, cmd: i32, fl: &mut libc::flock) -> i32 {
    // SAFETY: valid descriptor and flock struct.
    if unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) } == 0 {
        0
    } else {
        last_errno()
    }
}

fn flock(fd: i32, op: i32) -> i32 {
    // SAFETY: flock(2) on a valid descriptor.
    if unsafe { libc::flock(fd, op) } == 0 {
        0
    } else {
        last_errno()
    }
}

/// Forks a child that opens `path` and runs `f(fd)` (async-signal-safe calls only),
/// exiting with its result. Returns the child's pid.
fn fork_child(path: &Path, f: impl FnOnce(i32) -> i32) -> libc::pid_t {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: the child only calls open/fcntl/_exit, which are async-signal-safe.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let fd = libc::open(c.as_ptr(), libc::O_RDWR);
            let code = if fd < 0 { 100 } else { f(fd) };
            libc::_exit(code);
        }
        pid
    }
}

/// Waits up to `timeout` for child `pid`; its exit code, or None if still running.
fn wait_child(pid: libc::pid_t, timeout: Duration) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            // A child killed by a signal did not get to its exit code.
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn posix_and_bsd_locks_in_one_mount() {
    let c = cluster();
    let m = Mount::new(&c, "");
    let p = m.path("locked");
    fs::write(&p, vec![0u8; 1000]).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let fd = f.as_raw_fd();
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 100)), 0);
    let me = std::process::id() as i32;

    // Another process: a conflicting range fails with EAGAIN, F_GETLK names the
    // holder, a disjoint range is granted.
    let child = fork_child(&p, move |fd| {
        if fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 50, 10)) != libc::EAGAIN {
            return 1;
        }
        if fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_RDLCK, 99, 1)) != libc::EAGAIN {
            return 2;
        }
        let mut q = flock_t(libc::F_WRLCK, 10, 5);
        if fcntl_lock(fd, libc::F_GETLK, &mut q) != 0 || q.l_type != libc::F_WRLCK as i16 || q.l_pid != me {
            return 3;
        }
        if fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 100, 100)) != 0 {
            return 4;
        }
        0
    });
    assert_eq!(wait_child(child, Duration::from_secs(30)), Some(0), "child lock checks (exit code = failed step)");

    // Read locks share.
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_RDLCK, 0, 100)), 0, "downgrade");
    let child = fork_child(&p, |fd| fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_RDLCK, 0, 100)));
    assert_eq!(wait_child(child, Duration::from_secs(30)), Some(0), "two read locks coexist");

    // A blocked F_SETLKW waits until the holder unlocks.
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 100)), 0);
    let child = fork_child(&p, |fd| fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 0)));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(wait_child(child, Duration::ZERO), None, "F_SETLKW waits while the lock is held");
    // Closing ANY descriptor of the file drops the process's POSIX locks.
    drop(File::open(&p).unwrap());
    assert_eq!(wait_child(child, Duration::from_secs(30)), Some(0), "close released the lock; the waiter got it");

    // flock: separate opens conflict (each open file description is an owner).
    let a = File::open(&p).unwrap();
    let b = File::open(&p).unwrap();
    assert_eq!(flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(b.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(a.as_raw_fd(), libc::LOCK_SH), 0, "convert to shared");
    assert_eq!(flock(b.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), 0, "shared locks coexist");
    assert_eq!(flock(b.as_raw_fd(), libc::LOCK_UN), 0);
    drop(a); // The last close of the description releases its flock.
             // FUSE sends that release (RELEASE with the flock flag) after close(2) returns, so
             // it lands a moment later: poll for it.
    let released = (0..100).any(|_| {
        let ok = flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0;
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(released, "close released the flock");
    drop(b);
    drop(f);
}

/// Runs `f` on a thread; its result, or None if it is not done within `timeout`.
fn within_thread<T: Send + 'static>(timeout: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(timeout).ok()
}

extern "C" fn on_usr1(_: libc::c_int) {}

/// A signal with a handler ends a lock wait with EINTR, as on a local file system.
/// fuser answers the kernel's FUSE_INTERRUPT with "not supported", so before, a process
/// catching SIGINT or SIGALRM waited in F_SETLKW until it got the lock (stress-ng's
/// lockf stressor never ended).
#[test]
fn a_signal_ends_a_lock_wait_with_eintr() {
    let c = cluster();
    let m = Mount::new(&c, "");
    let p = m.path("held");
    fs::write(&p, b"x").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let fd = f.as_raw_fd();
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)), 0);
    let child = fork_child(&p, |fd| {
        // SAFETY: a handler that does nothing, installed without SA_RESTART.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
        }
        fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 0))
    });
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(wait_child(child, Duration::ZERO), None, "the child waits for the lock");
    // SAFETY: kill(2) of our own unreaped child.
    unsafe { libc::kill(child, libc::SIGUSR1) };
    let code = wait_child(child, Duration::from_secs(15));
    if code.is_none() {
        // SAFETY: as above; the test fails below either way.
        unsafe { libc::kill(child, libc::SIGKILL) };
        wait_child(child, Duration::from_secs(15));
    }
    assert_eq!(code, Some(libc::EINTR), "F_SETLKW ends with EINTR when a handled signal comes");
    // The lock stayed the holder's.
    let mut q = flock_t(libc::F_WRLCK, 0, 0);
    let other = fork_child(&p, move |fd| {
        if fcntl_lock(fd, libc::F_GETLK, &mut q) != 0 {
            return 1;
        }
        if q.l_type == libc::F_WRLCK as i16 {
            0
        } else {
            2
        }
    });
    assert_eq!(wait_child(other, Duration::from_secs(30)), Some(0), "the holder still holds the lock");
    drop(f);
}

/// Two owners each hold a lock the other then waits for: one of them must get EDEADLK
/// (as from the kernel for local POSIX locks; Lustre detects it across clients), and
/// the other the lock once the loser lets go. Before, both waited forever (stress-ng's
/// lockf stressor hung that way). Which one is told depends on which wait closes the
/// cycle: the second to wait, or the first when it asks again after its wait slice.
#[test]
fn a_lock_wait_that_would_deadlock_gets_edeadlk_in_one_mount_and_across_two() {
    let c = cluster();
    let m1 = Mount::new(&c, "");
    let m2 = Mount::new(&c, "");
    let p = m1.path("cycle");
    fs::write(&p, vec![0u8; 100]).unwrap();

    // Two processes of one mount.
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let fd = f.as_raw_fd();
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 10)), 0);
    let child = fork_child(&p, |fd| {
        if fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 10, 10)) != 0 {
            return 1;
        }
        fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 10))
    });
    wait_for("the child to hold [10, 20)", Duration::from_secs(30), || {
        let mut q = flock_t(libc::F_WRLCK, 10, 10);
        fcntl_lock(fd, libc::F_GETLK, &mut q) == 0 && q.l_type == libc::F_WRLCK as i16
    });
    std::thread::sleep(Duration::from_millis(300));
    let mine = within_thread(Duration::from_secs(30), move || {
        fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 10, 10))
    });
    if mine == Some(libc::EDEADLK) {
        assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 10)), 0);
    }
    let theirs = wait_child(child, Duration::from_secs(30));
    assert!(
        matches!((mine, theirs), (Some(libc::EDEADLK), Some(0)) | (Some(0), Some(libc::EDEADLK))),
        "one waiter told EDEADLK, the other granted: parent {mine:?}, child {theirs:?}"
    );
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 0)), 0);

    // Two clients.
    let f2 = OpenOptions::new().read(true).write(true).open(m2.path("cycle")).unwrap();
    let fd2 = f2.as_raw_fd();
    assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 10)), 0);
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 10, 10)), 0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = fcntl_lock(fd2, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 10));
        if r == libc::EDEADLK {
            fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 10, 10));
        }
        let _ = tx.send(r);
    });
    std::thread::sleep(Duration::from_millis(300));
    let first = within_thread(Duration::from_secs(30), move || {
        fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 10, 10))
    });
    if first == Some(libc::EDEADLK) {
        assert_eq!(fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 10)), 0);
    }
    let second = rx.recv_timeout(Duration::from_secs(30)).ok();
    assert!(
        matches!((first, second), (Some(libc::EDEADLK), Some(0)) | (Some(0), Some(libc::EDEADLK))),
        "one client told EDEADLK, the other granted: client 1 {first:?}, client 2 {second:?}"
    );
    drop(f2);
    drop(f);
}

/// A process waiting in F_SETLKW is a FUSE request the mount has not answered, and an
/// RPC waiting on the MDS. With more of them than the mount has FUSE threads (8 by
/// default), a mount whose threads each waited for their request's answer had none
/// left: the holder's unlock was never read, and the waiters, the holder and every
/// other process using the mount hung for good. Waiting requests hold no thread now
/// (the fuse crate's `serve`). With more of them than the MDS connection's request
/// slots (32), the unlock found no slot until the MDS's 10 s wait slices ended, and
/// the lock took 19 s to pass through 40 waiters: now at most 16 wait on the MDS at
/// once, for slices of 1 s, and the others take turns in the client.
#[test]
fn more_lock_waiters_than_mount_threads_leave_the_mount_answering() {
    let c = cluster();
    let m = Mount::new(&c, "");
    let p = m.path("contended");
    fs::write(&p, b"x").unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    assert_eq!(fcntl_lock(f.as_raw_fd(), libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)), 0);
    let mut waiters: Vec<libc::pid_t> = (0..40)
        .map(|_| {
            fork_child(&p, |fd| {
                let got = fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 0));
                // Unlocked as Python's lockf does, with F_SETLKW; half the waiters
                // leave it to their exit instead.
                // SAFETY: getpid cannot fail.
                if got == 0 && unsafe { libc::getpid() } % 2 == 0 {
                    return fcntl_lock(fd, libc::F_SETLKW, &mut flock_t(libc::F_UNLCK, 0, 0));
                }
                got
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Only children not reaped yet: a reaped child's pid may be another process's now.
    let kill_all = |waiters: &[libc::pid_t]| {
        for &w in waiters {
            // SAFETY: killing our own child, not reaped yet.
            unsafe { libc::kill(w, libc::SIGKILL) };
        }
    };
    if let Some(i) = waiters.iter().position(|&w| wait_child(w, Duration::ZERO).is_some()) {
        let w = waiters.remove(i);
        kill_all(&waiters);
        panic!("waiter {w} ended while the lock was held");
    }
    // Other work through the mount, on a thread: a hung mount would hang the test.
    let other = m.path("other");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = fs::write(&other, b"still answering").and_then(|_| fs::read(&other));
        let _ = tx.send(r.map(|b| b == b"still answering"));
    });
    let answered = rx.recv_timeout(Duration::from_secs(30));
    if !matches!(answered, Ok(Ok(true))) {
        // A stuck mount: the waiters, and a close of the holder's descriptor, would
        // hang until the mount process goes (the Mount's drop kills it).
        kill_all(&waiters);
        std::thread::spawn(move || drop(f));
        panic!("the mount stopped answering while processes waited for a lock: {answered:?}");
    }
    // The holder's close drops its lock; the waiters take it one after the other. The
    // close itself is on a thread: a stuck unlock must fail the test, not hang it.
    let unlocked = std::time::Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(f);
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        kill_all(&waiters);
        panic!("the holder's close did not return");
    }
    let exits: Vec<Option<i32>> = waiters.iter().map(|&w| wait_child(w, Duration::from_secs(30))).collect();
    let passed = unlocked.elapsed();
    let left: Vec<libc::pid_t> = waiters.iter().zip(&exits).filter(|(_, e)| e.is_none()).map(|(&w, _)| w).collect();
    kill_all(&left);
    assert!(exits.iter().all(|e| *e == Some(0)), "every waiter got the lock once it was free: {exits:?}");
    // Not a measure of speed: the lock passes through 40 waiters in well under a second
    // here; a stall behind a wait slice (10 s before) is what this catches.
    assert!(passed < Duration::from_secs(8), "the lock took {passed:?} to pass through 40 waiters");
}

#[test]
fn locks_exclude_across_clients_and_die_with_them() {
    let c = cluster();
    let mut m1 = Mount::new(&c, "");
    let m2 = Mount::new(&c, "");
    fs::write(m1.path("shared"), vec![0u8; 4096]).unwrap();
    let f1 = OpenOptions::new().read(true).write(true).open(m1.path("shared")).unwrap();
    let f2 = OpenOptions::new().read(true).write(true).open(m2.path("shared")).unwrap();
    let (fd1, fd2) = (f1.as_raw_fd(), f2.as_raw_fd());

    // fcntl: client 1 holds [0, 1000); client 2 is refused there and told who holds it.
    assert_eq!(fcntl_lock(fd1, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 1000)), 0);
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 999, 10)), libc::EAGAIN);
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_RDLCK, 0, 1)), libc::EAGAIN);
    let mut q = flock_t(libc::F_WRLCK, 0, 10);
    assert_eq!(fcntl_lock(fd2, libc::F_GETLK, &mut q), 0);
    assert_eq!(q.l_type, libc::F_WRLCK as i16, "F_GETLK on client 2 sees client 1's lock");
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 1000, 1000)), 0, "disjoint range");
    assert_eq!(fcntl_lock(fd1, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 1000)), 0);
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 1000)), 0, "granted after unlock");
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 0)), 0);

    // flock across clients.
    let g1 = File::open(m1.path("shared")).unwrap();
    let g2 = File::open(m2.path("shared")).unwrap();
    assert_eq!(flock(g1.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(flock(g2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(g2.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(g1.as_raw_fd(), libc::LOCK_UN), 0);
    assert_eq!(flock(g2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(flock(g1.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(g2.as_raw_fd(), libc::LOCK_UN), 0);

    // A blocking lock on client 2 is granted when client 1 releases.
    assert_eq!(fcntl_lock(fd1, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)), 0);
    let waiter = std::thread::spawn(move || {
        let r = fcntl_lock(fd2, libc::F_SETLKW, &mut flock_t(libc::F_WRLCK, 0, 0));
        (r, f2)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "F_SETLKW on client 2 waits for client 1");
    assert_eq!(fcntl_lock(fd1, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 0)), 0);
    let (r, f2) = waiter.join().unwrap();
    assert_eq!(r, 0, "the waiter got the lock");
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 0)), 0);

    // Client 1 takes both kinds of lock (on two files: flock and fcntl locks share one
    // lock space on the MDS, a documented braid choice) and dies (SIGKILL of the
    // mount process): its locks go with it.
    drop(g1);
    drop(g2);
    fs::write(m1.path("other"), b"o").unwrap();
    let g1 = File::open(m1.path("other")).unwrap();
    let g2 = File::open(m2.path("other")).unwrap();
    assert_eq!(fcntl_lock(fd1, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)), 0);
    assert_eq!(flock(g1.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)), libc::EAGAIN);
    assert_eq!(flock(g2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    m1.kill();
    drop(f1);
    drop(g1);
    wait_for("the dead client's fcntl lock to be released", Duration::from_secs(30), || {
        fcntl_lock(fd2, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 0)) == 0
    });
    wait_for("the dead client's flock to be released", Duration::from_secs(30), || {
        flock(g2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0
    });
    drop(f2);
    drop(g2);
}

/// Writes `data` as `fs::write` does (create or truncate, write, close), but fails
/// on an error of close(2), which `fs::write` drops: the close is where a FUSE mount
/// publishes the size for close-to-open readers.
fn write_and_close(path: &Path, data: &[u8]) {
    use std::os::unix::io::IntoRawFd;
    let mut f = File::create(path).unwrap();
    f.write_all(data).unwrap();
    // SAFETY: the descriptor is ours, taken out of the File, closed once.
    let r = unsafe { libc::close(f.into_raw_fd()) };
    assert_eq!(r, 0, "close(2) of {}: errno {}", path.display(), last_errno());
}

#[test]
fn close_to_open_and_disjoint_writes_across_clients() {
    let c = cluster();
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    // B looks at the file first, so its kernel caches the old attributes.
    fs::write(a.path("f"), b"version one").unwrap();
    assert_eq!(fs::read(b.path("f")).unwrap(), b"version one");
    assert_eq!(fs::metadata(b.path("f")).unwrap().len(), 11);
    for (i, len) in [(2u64, 3_000_000usize), (3, 100), (4, 1_500_000)] {
        let v = pattern(len, i);
        write_and_close(&a.path("f"), &v); // open, write, close on A
        let got = fs::read(b.path("f")).unwrap(); // then open on B
        if got != v {
            // What each side holds now tells a late size report from a stale reader.
            let (on_a, on_b) = (fs::metadata(a.path("f")).unwrap().len(), fs::metadata(b.path("f")).unwrap().len());
            let native = c.get("/f").len();
            panic!(
                "version {i}: B read {} bytes, A wrote {len}; now A stats {on_a}, B stats {on_b}, the native client reads {native}",
                got.len()
            );
        }
    }
    // A new file created on A and closed is there, whole, for B.
    let v = pattern(777_777, 9);
    write_and_close(&a.path("new"), &v);
    assert!(fs::read(b.path("new")).unwrap() == v, "B reads A's new file whole");

    // ior-hard: interleaved 47,008-byte records of one shared file, even records from
    // A and odd ones from B, written at the same time.
    const REC: usize = 47_008;
    const N: usize = 96;
    File::create(a.path("ior")).unwrap();
    let writer = |m: &Mount, parity: usize| {
        let f = OpenOptions::new().write(true).open(m.path("ior")).unwrap();
        move || {
            for i in (parity..N).step_by(2) {
                f.write_all_at(&pattern(REC, 1000 + i as u64), (i * REC) as u64).unwrap();
            }
            f.sync_all().unwrap();
        }
    };
    let (wa, wb) = (writer(&a, 0), writer(&b, 1));
    let (ta, tb) = (std::thread::spawn(wa), std::thread::spawn(wb));
    ta.join().unwrap();
    tb.join().unwrap();
    let want: Vec<u8> = (0..N).flat_map(|i| pattern(REC, 1000 + i as u64)).collect();
    for (name, m) in [("A", &a), ("B", &b)] {
        let got = fs::read(m.path("ior")).unwrap();
        assert_eq!(got.len(), want.len(), "size seen on {name}");
        if let Some(i) = (0..N).find(|&i| got[i * REC..(i + 1) * REC] != want[i * REC..(i + 1) * REC]) {
            panic!("record {i} (written by {}) is wrong when read on {name}", if i % 2 == 0 { "A" } else { "B" });
        }
    }
    assert!(c.get("/ior") == want, "the native client reads exactly the bytes written");
}

#[test]
fn attributes_cross_clients_within_the_cache_time() {
    let c = cluster();
    // No attribute cache: a change on A shows on B at once.
    let a = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
    let b = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
    fs::write(a.path("f"), b"12345").unwrap();
    assert_eq!(fs::metadata(b.path("f")).unwrap().len(), 5);
    fs::set_permissions(a.path("f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(b.path("f")).unwrap().mode() & 0o7777, 0o600);
    std::os::unix::fs::chown(a.path("f"), Some(77), Some(88)).unwrap();
    let m = fs::metadata(b.path("f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (77, 88));
    OpenOptions::new().write(true).open(a.path("f")).unwrap().set_len(2).unwrap();
    assert_eq!(fs::metadata(b.path("f")).unwrap().len(), 2);
    assert_eq!(fs::read(b.path("f")).unwrap(), b"12");
    fs::rename(a.path("f"), a.path("g")).unwrap();
    assert!(fs::metadata(b.path("f")).is_err(), "the old name is gone on B");
    assert_eq!(fs::metadata(b.path("g")).unwrap().len(), 2);
    fs::remove_file(a.path("g")).unwrap();
    assert_eq!(fs::metadata(b.path("g")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    drop((a, b));

    // With a 1 s cache a change shows once the cache time has passed.
    let a = Mount::new(&c, "attr_timeout=1,entry_timeout=1");
    let b = Mount::new(&c, "attr_timeout=1,entry_timeout=1");
    fs::write(a.path("h"), b"x").unwrap();
    assert_eq!(fs::metadata(b.path("h")).unwrap().mode() & 0o777, 0o644);
    fs::set_permissions(a.path("h"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::write(a.path("h"), b"longer").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    wait_for("B to see A's chmod and size", Duration::from_secs(30), || {
        fs::metadata(b.path("h")).is_ok_and(|m| m.mode() & 0o777 == 0o640 && m.len() == 6)
    });
}

/// Sets the mtime of open file `f` (futimens, the atime left alone).
fn set_mtime(f: &File, sec: i64) {
    let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, libc::timespec { tv_sec: sec, tv_nsec: 0 }];
    // SAFETY: a valid descriptor and two timespecs.
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) }, 0, "futimens: errno {}", last_errno());
}

#[test]
fn times_set_through_the_descriptor_after_its_writes_stay_for_other_clients() {
    let c = cluster();
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
    fs::create_dir(a.path("dom")).unwrap();
    let out = c.braid(&["setstripe", "--template", "seed-table5", &c.url("/dom")]);
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    const OLD: i64 = 1_685_030_075;
    for dir in [".", "dom"] {
        // As `tar x` and `cp -p` do: write, set the times through the descriptor,
        // close. Small files (DoM: bytes that may go with the create), files past the
        // DoM component, and writes in several pieces.
        for (i, pieces) in [vec![10], vec![9216, 3216], vec![100_000], vec![65_536, 70_000]].into_iter().enumerate() {
            let name = format!("{dir}/tar{i}");
            let want: Vec<u8> = pieces.iter().enumerate().flat_map(|(j, &n)| pattern(n, (i * 10 + j) as u64)).collect();
            let mut f = OpenOptions::new().write(true).create_new(true).open(a.path(&name)).unwrap();
            let mut at = 0;
            for &n in &pieces {
                std::io::Write::write_all(&mut f, &want[at..at + n]).unwrap();
                at += n;
            }
            set_mtime(&f, OLD);
            drop(f);
            let m = fs::metadata(b.path(&name)).unwrap();
            assert_eq!((m.mtime(), m.len()), (OLD, want.len() as u64), "{name}: mtime and size seen by another client");
            assert!(fs::read(b.path(&name)).unwrap() == want, "{name}: bytes seen by another client");
            assert_eq!(fs::metadata(a.path(&name)).unwrap().mtime(), OLD, "{name}: mtime seen by the writer");
        }
        // A write after the times were set moves the mtime again, as on a local file
        // system.
        let name = format!("{dir}/later");
        let mut f = OpenOptions::new().write(true).create_new(true).open(a.path(&name)).unwrap();
        std::io::Write::write_all(&mut f, b"first").unwrap();
        set_mtime(&f, OLD);
        std::io::Write::write_all(&mut f, b" then more").unwrap();
        drop(f);
        let m = fs::metadata(b.path(&name)).unwrap();
        assert!(m.mtime() > OLD + 86_400, "{name}: the last write's mtime, not the one set before it: {}", m.mtime());
        assert_eq!(m.len(), 15);
    }
}

#[test]
fn an_open_finds_the_file_another_client_renamed_over_the_name_at_once() {
    let c = cluster();
    let a = Mount::new(&c, "");
    // B keeps names and attributes for a minute: only the open can tell.
    let b = Mount::new(&c, "attr_timeout=60,entry_timeout=60");
    fs::write(a.path("conf"), b"version 1").unwrap();
    assert_eq!(fs::read(b.path("conf")).unwrap(), b"version 1");
    // An editor's save on A: a new file written, then renamed over the name. On odd
    // rounds a process on B holds the old file open meanwhile (as `tail -f` would): it
    // keeps reading the old file, while an open of the name finds the new one.
    let mut before = "version 1".to_string();
    for i in 2..8 {
        let v = format!("version {i}, longer than the one before {}", "x".repeat(i));
        let held = (i % 2 == 1).then(|| File::open(b.path("conf")).unwrap());
        fs::write(a.path(".conf.tmp"), &v).unwrap();
        fs::rename(a.path(".conf.tmp"), a.path("conf")).unwrap();
        assert_eq!(fs::read_to_string(b.path("conf")).unwrap(), v, "B opens the name after A's rename");
        if let Some(mut held) = held {
            let mut old = String::new();
            std::io::Read::read_to_string(&mut held, &mut old).unwrap();
            assert_eq!(old, before, "the file B held open before the rename");
        }
        before = v;
    }
    // Removed on A: B's open finds no file, though its kernel still has the name.
    fs::remove_file(a.path("conf")).unwrap();
    assert_eq!(File::open(b.path("conf")).unwrap_err().raw_os_error(), Some(libc::ENOENT));

    // An unlinked file this mount holds open is still reopened through /proc.
    let f = File::create(b.path("held")).unwrap();
    std::io::Write::write_all(&mut &f, b"still here").unwrap();
    fs::remove_file(b.path("held")).unwrap();
    let again = fs::read(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    assert_eq!(again, b"still here");
}

fn local_and_tcp_clients_share_one_namespace(extra: &[&str], in_process: bool) {
    let dir = testkit::TempDir::new("local-mount");
    let bin = Path::new(env!("CARGO_BIN_EXE_braid"));
    // `braid local --mount` as a running process: its own mount reaches the servers
    // in-process (`rpc::local`), while a second client (a `braid mount` process)
    // reaches the same servers over TCP.
    let l = LocalCluster::start(bin, dir.path(), extra);
    // The mount's client (role "client") found its servers in this process, or not.
    let log = fs::read_to_string(&l.daemon.log).unwrap();
    let delivered = log.lines().filter(|l| l.contains("delivered in-process") && l.contains("role=client")).count();
    assert_eq!(delivered > 0, in_process, "in-process delivery to the mount's servers:\n{log}");
    let other = Mount::of(bin, &l.url(), &l.secret(), dir.path(), "");
    let (here, there) = (|p: &str| l.mnt.join(p), |p: &str| other.path(p));

    // Data crosses in both directions at close-to-open, striped over both OSTs.
    fs::create_dir(here("d")).unwrap();
    let status = std::process::Command::new(bin)
        .args(["setstripe", "-c", "2", "-S", "65536", here("d").to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "setstripe on a directory of the local mount");
    let one = pattern(3 << 20, 21);
    fs::write(here("d/one"), &one).unwrap();
    assert!(fs::read(there("d/one")).unwrap() == one, "the TCP client reads what the in-process one wrote");
    let two = pattern((1 << 20) + 4097, 22);
    fs::write(there("d/two"), &two).unwrap();
    assert!(fs::read(here("d/two")).unwrap() == two, "the in-process client reads what the TCP one wrote");
    assert!(l.objects() >= 4, "both files are striped over both OSTs");

    // Namespace operations and their errors through the in-process client.
    fs::create_dir(here("e")).unwrap();
    fs::rename(here("d/one"), here("e/one")).unwrap();
    assert_eq!(fs::read_dir(there("e")).unwrap().count(), 1);
    assert_eq!(fs::remove_dir(here("e")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(fs::create_dir(here("e")).unwrap_err().raw_os_error(), Some(libc::EEXIST));
    assert_eq!(fs::metadata(here("e/one")).unwrap().size(), one.len() as u64);

    // Locks taken through one client exclude the other.
    let a = File::open(here("e/one")).unwrap();
    let b = File::open(there("e/one")).unwrap();
    assert_eq!(flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    drop(a);
    wait_for("the in-process client's flock to be released", Duration::from_secs(10), || {
        flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0
    });
    drop(b);

    // Removing every file destroys every object.
    fs::remove_file(here("e/one")).unwrap();
    fs::remove_file(there("d/two")).unwrap();
    wait_for("the OST objects of removed files to be destroyed", Duration::from_secs(20), || l.objects() == 0);
    drop(other);
}

#[test]
fn braid_local_mount_in_process_and_a_tcp_client_share_one_namespace() {
    local_and_tcp_clients_share_one_namespace(&[], true);
}

#[test]
fn braid_local_mount_over_tcp_behaves_the_same() {
    local_and_tcp_clients_share_one_namespace(&["--tcp"], false);
}

#[test]
fn files_removed_on_one_mount_are_gone_for_the_other_at_its_next_look() {
    // A makes a directory (and so holds its lease), fills it, and removes the files:
    // its mount answers those unlinks itself and sends them behind. B's first look
    // takes the lease back, and A acks only once they have landed.
    let c = cluster();
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    for round in 0..3 {
        let dir = format!("t{round}");
        fs::create_dir(a.path(&dir)).unwrap();
        for i in 0..100 {
            fs::write(a.path(&format!("{dir}/f{i}")), pattern(1000 + i, i as u64)).unwrap();
        }
        for i in 0..100 {
            fs::remove_file(a.path(&format!("{dir}/f{i}"))).unwrap();
        }
        let left: Vec<_> = fs::read_dir(b.path(&dir)).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "round {round}: B lists {} of the removed files", left.len());
        assert_eq!(fs::metadata(b.path(&format!("{dir}/f7"))).unwrap_err().raw_os_error(), Some(libc::ENOENT));
        // And a whole tree removed on A (rm -rf: each directory emptied, then removed).
        for d in 0..5 {
            fs::create_dir_all(a.path(&format!("{dir}/sub/d{d}"))).unwrap();
            for i in 0..20 {
                fs::write(a.path(&format!("{dir}/sub/d{d}/f{i}")), b"x").unwrap();
            }
        }
        fs::remove_dir_all(a.path(&format!("{dir}/sub"))).unwrap();
        fs::remove_dir(a.path(&dir)).unwrap();
        assert_eq!(fs::metadata(b.path(&dir)).unwrap_err().raw_os_error(), Some(libc::ENOENT), "round {round}");
    }
}

/// futimens(2) with both times.
fn set_times(f: &File, atime: i64, mtime: i64) {
    let times = [libc::timespec { tv_sec: atime, tv_nsec: 0 }, libc::timespec { tv_sec: mtime, tv_nsec: 0 }];
    // SAFETY: a valid descriptor and two timespecs.
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) }, 0, "futimens: errno {}", last_errno());
}

#[test]
fn a_file_created_chowned_chmodded_and_timed_on_one_mount_is_whole_for_the_other() {
    // tar's way: create, write, fchown, fchmod, futimens, close. A's mount answers
    // the attribute changes itself and sends them behind the create; B's open after
    // A's close finds the file whole, with its owner, mode and times.
    let c = cluster();
    let mut a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    fs::create_dir(a.path("x")).unwrap();
    for i in 0..50u32 {
        let f = File::create(a.path(&format!("x/f{i}"))).unwrap();
        (&f).write_all(&pattern(100 + i as usize * 997, i as u64)).unwrap();
        std::os::unix::fs::fchown(&f, Some(1000 + i), Some(2000 + i)).unwrap();
        f.set_permissions(fs::Permissions::from_mode(0o600 + (i % 8) * 0o10)).unwrap();
        set_times(&f, 1_000_000 + i as i64, 2_000_000 + i as i64);
    }
    for i in 0..50u32 {
        let p = b.path(&format!("x/f{i}"));
        assert!(fs::read(&p).unwrap() == pattern(100 + i as usize * 997, i as u64), "f{i}'s bytes on B");
        let m = fs::metadata(&p).unwrap();
        let got = (m.uid(), m.gid(), m.mode() & 0o7777, m.atime(), m.mtime());
        let want = (1000 + i, 2000 + i, 0o600 + (i % 8) * 0o10, 1_000_000 + i as i64, 2_000_000 + i as i64);
        assert_eq!(got, want, "f{i}'s attributes on B");
    }

    // The same, seen by A itself at once (its own answers), then after a change of a
    // kind it leaves to the MDS (a set-group-ID bit) and one after that.
    let f = File::create(a.path("x/g")).unwrap();
    (&f).write_all(b"gg").unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(a.path("x/g")).unwrap().mode() & 0o7777, 0o640);
    f.set_permissions(fs::Permissions::from_mode(0o2750)).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o710)).unwrap();
    set_times(&f, 7, 8);
    drop(f);
    // Opened on B (close-to-open): a stat alone may be answered from B's statahead,
    // fetched up to a second earlier (see the client's `statahead`), as the kernel's
    // own attribute cache may answer it.
    let m = File::open(b.path("x/g")).unwrap().metadata().unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime(), m.len()), (0o710, 8, 2));

    // What an fsync acknowledged survives the mount's death.
    let f = File::create(a.path("x/h")).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o604)).unwrap();
    set_times(&f, 11, 12);
    f.sync_all().unwrap();
    a.kill();
    drop(f);
    let m = File::open(b.path("x/h")).unwrap().metadata().unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o604, 12), "the fsynced changes are on the MDS");
}

#[test]
fn locks_held_through_one_mount_survive_an_mds_restart() {
    let mut c = cluster();
    let (a, b) = (Mount::new(&c, ""), Mount::new(&c, ""));
    fs::write(a.path("replayed"), vec![0u8; 4096]).unwrap();
    fs::write(a.path("flocked"), b"f").unwrap();
    let held = OpenOptions::new().read(true).write(true).open(a.path("replayed")).unwrap();
    assert_eq!(fcntl_lock(held.as_raw_fd(), libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 100)), 0);
    let flocked = File::open(a.path("flocked")).unwrap();
    assert_eq!(flock(flocked.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);

    c.kill("mds");
    c.restart("mds");

    // Through the other mount, once the MDS is back: what the first holds is still
    // taken (its mount asked for it again), and the rest is free.
    let pb = b.path("replayed");
    let child = fork_child(&pb, |fd| fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 50, 10)));
    assert_eq!(wait_child(child, Duration::from_secs(60)), Some(libc::EAGAIN), "the held range after the restart");
    let child = fork_child(&pb, |fd| fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 100, 10)));
    assert_eq!(wait_child(child, Duration::from_secs(60)), Some(0), "a range nobody held");
    let child = fork_child(&b.path("flocked"), |fd| flock(fd, libc::LOCK_EX | libc::LOCK_NB));
    assert_eq!(wait_child(child, Duration::from_secs(60)), Some(libc::EWOULDBLOCK), "the flock after the restart");

    // Released, they are free for the other mount.
    assert_eq!(fcntl_lock(held.as_raw_fd(), libc::F_SETLK, &mut flock_t(libc::F_UNLCK, 0, 100)), 0);
    drop(flocked);
    let child = fork_child(&pb, |fd| fcntl_lock(fd, libc::F_SETLK, &mut flock_t(libc::F_WRLCK, 0, 100)));
    assert_eq!(wait_child(child, Duration::from_secs(60)), Some(0), "the range once released");
    // A flock goes with the file's release, which close(2) does not wait for.
    wait_for("the flock to be released", Duration::from_secs(30), || {
        let child = fork_child(&b.path("flocked"), |fd| flock(fd, libc::LOCK_EX | libc::LOCK_NB));
        wait_child(child, Duration::from_secs(60)) == Some(0)
    });
}

#[test]
fn a_file_unlinked_while_open_survives_an_mds_restart() {
    let mut c = cluster();
    let m = Mount::new(&c, "");
    let data = pattern(3 << 20, 11);
    fs::write(m.path("orphan"), &data).unwrap();
    let reader = File::open(m.path("orphan")).unwrap();
    let writer = OpenOptions::new().write(true).open(m.path("orphan")).unwrap();
    fs::remove_file(m.path("orphan")).unwrap();

    c.kill("mds");
    c.restart("mds");
    // Past the recovery window and the orphan reaper's passes after it.
    std::thread::sleep(Duration::from_secs(5));
    writer.write_all_at(b"still here", 0).unwrap();
    writer.sync_all().unwrap();
    let mut back = vec![0u8; data.len()];
    reader.read_exact_at(&mut back, 0).unwrap();
    assert!(back[..10] == b"still here"[..] && back[10..] == data[10..], "the open file's bytes after the restart");
    drop((reader, writer));
    // Closed, it goes.
    wait_for("the orphan's objects to be destroyed", Duration::from_secs(30), || {
        (0..4).all(|i| testkit::objects_in(&c.ost_dir(i)).is_empty())
    });
}
