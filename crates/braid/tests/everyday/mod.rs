//! The everyday workload of issue 39 through a mount and its checker, shared by the
//! fault tests (`faults.rs`, and `netns_faults.rs` on separate nodes): a bash
//! process that creates files, changes their owner, mode and mtime, moves some to
//! another directory and removes others, printing what each `fsync` acknowledged, and [`check_acked`], which checks that all of it is
//! there afterwards.

// Each test file that includes this module uses its own part of it.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the workload was told had happened, once `fsync` returned.
pub enum Acked {
    File {
        path: PathBuf,
        len: usize,
        uid: u32,
        gid: u32,
        mode: u32,
        mtime: i64,
    },
    /// An unlink was asked for: from here on the file may be gone.
    Removing(PathBuf),
    /// ... and it and the directory's fsync returned.
    Gone(PathBuf),
    /// A rename was asked for: from here on the file may be at either name.
    Moving {
        from: PathBuf,
        to: PathBuf,
    },
    /// ... and it and both directories' fsyncs returned: the file is at `to` only.
    Moved {
        from: PathBuf,
        to: PathBuf,
    },
}

/// The everyday work of issue 39 through a mount, as a user's shell does it, in
/// directories it makes (and so holds the leases on, with creates, attribute changes
/// and unlinks answered by the mount and sent behind): each file created and held
/// open, written, chowned, chmodded and its mtime set, fsynced (`sync FILE`) and
/// closed; every third file (the second of each three) then renamed into a directory
/// of moved files (`rK` beside `dK`), both directories fsynced; every third file, the
/// one before removed and its directory fsynced. Each step is acknowledged on
/// standard output once its fsync returned. It runs until its second argument, a
/// file, exists.
///
/// A process of its own, not a thread of the test: a thread of the test blocked in a
/// FUSE request for a server the test killed holds up the test's own fork of the
/// server's restart until the mount gives up (as it would hold up any fork of a
/// process whose other thread waits on the mount).
pub const EVERYDAY_WORKLOAD: &str = r#"
root=$1 stop=$2
i=0
while [ ! -e "$stop" ]; do
    d="$root/d$((i / 50))"; f="$d/f$i"
    uid=$((1000 + i % 7)); gid=$((2000 + i % 5)); mode=$(printf %o $((0600 + (i % 8) * 8))); mtime=$((2000000 + i))
    data=$(printf "file $i %.0s" $(seq 0 $((i % 300))))
    if mkdir -p "$d" && { printf %s "$data" >&3 && chown "$uid:$gid" "$f" && chmod "$mode" "$f" \
        && touch -m -d "@$mtime" "$f" && sync "$f"; } 3>"$f"; then
        echo "F $f ${#data} $uid $gid $mode $mtime"
        if [ $((i % 3)) = 1 ]; then
            r="$root/r$((i / 50))"
            echo "V $f $r/f$i"
            mkdir -p "$r" && mv "$f" "$r/f$i" && sync "$d" "$r" && echo "W $f $r/f$i" || echo "error mv f$i" >&2
        fi
    else
        echo "error f$i" >&2
    fi
    if [ $((i % 3)) = 0 ] && [ $i -gt 0 ]; then
        p="$root/d$(((i - 1) / 50))/f$((i - 1))"
        echo "R $p"
        rm -f "$p" && sync "$(dirname "$p")" && echo "G $p" || echo "error rm f$((i - 1))" >&2
    fi
    i=$((i + 1))
    echo $i >"$stop.made"
done
"#;

/// How many files the workload stopped by `stop` has gone through (made, or failed).
pub fn everyday_progress(stop: &Path) -> u64 {
    std::fs::read_to_string(format!("{}.made", stop.display())).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Lets the workload stopped by `stop` go on until it went through `n` more files
/// (the servers' recovery after a kill takes seconds, during which it may make none),
/// for at most a minute.
pub fn everyday_goes_on(stop: &Path, n: u64) {
    let (from, start) = (everyday_progress(stop), Instant::now());
    while everyday_progress(stop) < from + n && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where the workload stopped by `stop` writes its standard output (`out`) or error.
fn output(stop: &Path, what: &str) -> PathBuf {
    PathBuf::from(format!("{}.{what}", stop.display()))
}

/// Starts [`EVERYDAY_WORKLOAD`] in `root`; it runs until `stop` exists (and is
/// killed if the thread that started it ends first). What it prints goes to files
/// beside `stop`, not to pipes: nobody reads a pipe before the workload ends, and a
/// long run fills one (64 KiB), which stops the workload in its next `echo`.
pub fn start_everyday_workload(root: &Path, stop: &Path) -> Child {
    let file = |what| std::fs::File::create(output(stop, what)).expect("the workload's output file");
    let mut cmd = Command::new("bash");
    cmd.args(["-c", EVERYDAY_WORKLOAD, "everyday"])
        .arg(root)
        .arg(stop)
        .stdin(Stdio::null())
        .stdout(file("out"))
        .stderr(file("err"));
    testkit::die_with_parent(&mut cmd).spawn().expect("start the workload")
}

/// Stops the workload (it stops by itself if the mount went away) and returns what
/// it acknowledged and the errors it met.
pub fn finish_everyday_workload(stop: &Path, mut child: Child) -> (Vec<Acked>, Vec<String>) {
    std::fs::write(stop, b"").expect("the stop file");
    child.wait().expect("the workload's end");
    let read = |what| {
        let text = std::fs::read(output(stop, what)).expect("the workload's output");
        let text = String::from_utf8_lossy(&text).into_owned();
        let _ = std::fs::remove_file(output(stop, what));
        text
    };
    let (out, err) = (read("out"), read("err"));
    let _ = std::fs::remove_file(stop);
    let _ = std::fs::remove_file(format!("{}.made", stop.display()));
    let acked = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            match w[..] {
                ["F", p, len, uid, gid, mode, mtime] => Some(Acked::File {
                    path: p.into(),
                    len: len.parse().ok()?,
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                    mode: u32::from_str_radix(mode, 8).ok()?,
                    mtime: mtime.parse().ok()?,
                }),
                ["R", p] => Some(Acked::Removing(p.into())),
                ["G", p] => Some(Acked::Gone(p.into())),
                ["V", from, to] => Some(Acked::Moving { from: from.into(), to: to.into() }),
                ["W", from, to] => Some(Acked::Moved { from: from.into(), to: to.into() }),
                _ => None,
            }
        })
        .collect();
    (acked, err.lines().map(str::to_string).collect())
}

/// Checks every acknowledged change under `root` (as seen through `at`, the same tree
/// under another mount): files whole, with their owner, mode and mtime, under their
/// new name once a rename was acknowledged (under either while it was not); removed
/// and renamed-away names absent. Returns how many files were checked; panics at the first change
/// that is not there.
pub fn check_acked(acked: &[Acked], root: &Path, at: &Path) -> usize {
    let (checked, problems) = check_acked_all(acked, root, at);
    if let Some(first) = problems.first() {
        panic!("{first}");
    }
    checked
}

/// [`check_acked`] that goes through everything: how many files were checked and
/// every acknowledged change that is not there, one line each.
pub fn check_acked_all(acked: &[Acked], root: &Path, at: &Path) -> (usize, Vec<String>) {
    use std::os::unix::fs::MetadataExt;
    let moved = |p: &Path| at.join(p.strip_prefix(root).expect("under the workload's root"));
    let removing: HashSet<PathBuf> =
        acked.iter().filter_map(|a| if let Acked::Removing(p) = a { Some(moved(p)) } else { None }).collect();
    let renaming: HashMap<PathBuf, PathBuf> = acked
        .iter()
        .filter_map(|a| if let Acked::Moving { from, to } = a { Some((moved(from), moved(to))) } else { None })
        .collect();
    let renamed: HashMap<PathBuf, PathBuf> = acked
        .iter()
        .filter_map(|a| if let Acked::Moved { from, to } = a { Some((moved(from), moved(to))) } else { None })
        .collect();
    let (mut checked, mut problems) = (0, Vec::new());
    for a in acked {
        match a {
            Acked::Removing(_) | Acked::Moving { .. } | Acked::Moved { .. } => {}
            Acked::Gone(p) => {
                if moved(p).exists() {
                    problems.push(format!("{} was removed and is back", moved(p).display()));
                }
            }
            Acked::File { path, len, uid, gid, mode, mtime } => {
                let mut p = moved(path);
                if removing.contains(&p) {
                    continue;
                }
                if let Some(to) = renamed.get(&p) {
                    if p.exists() {
                        problems.push(format!("{} was renamed to {} and is still there", p.display(), to.display()));
                    }
                    p = to.clone();
                } else if let Some(to) = renaming.get(&p) {
                    // The rename's outcome was never acknowledged: either name, not both.
                    match (p.exists(), to.exists()) {
                        (true, true) => problems.push(format!(
                            "{} was being renamed to {} and both names are there",
                            p.display(),
                            to.display()
                        )),
                        (false, true) => p = to.clone(),
                        _ => {}
                    }
                }
                match std::fs::metadata(&p) {
                    Err(e) => problems.push(format!("{}: acknowledged, now {e}", p.display())),
                    Ok(m) => {
                        let got = (m.len() as usize, m.uid(), m.gid(), m.mode() & 0o7777, m.mtime());
                        if got != (*len, *uid, *gid, *mode, *mtime) {
                            let show = |(len, uid, gid, mode, mtime): (usize, u32, u32, u32, i64)| {
                                format!("{len} bytes, {uid}:{gid}, mode {mode:o}, mtime {mtime}")
                            };
                            problems.push(format!(
                                "{}: acknowledged {}, found {}",
                                p.display(),
                                show((*len, *uid, *gid, *mode, *mtime)),
                                show(got)
                            ));
                        }
                    }
                }
                checked += 1;
            }
        }
    }
    (checked, problems)
}
