//! `mount -t fuse.braid` and `/etc/fstab`: braid as a mount(8) helper. A line
//!
//! ```text
//! braid://10.0.0.1:9400/  /mnt/braid  fuse.braid  _netdev,secret_file=/etc/braid/cluster.secret  0 0
//! ```
//!
//! (or a systemd `.mount` unit, which is the same line) reaches the `braid` binary in
//! one of two ways, and both end here:
//!
//! - mount(8) runs `/sbin/mount.fuse.braid SOURCE MOUNTPOINT [-s] [-f] [-n] [-v] [-o
//!   OPTIONS]` when that file exists: a symlink to `braid` (`mount.braid` too, for
//!   `-t braid`). It looks in `/sbin` only (util-linux's `FS_SEARCH_PATH`).
//! - Without it, mount(8) runs fuse3's `/sbin/mount.fuse`, which runs `braid SOURCE
//!   MOUNTPOINT -o OPTIONS` through `/bin/sh`. mount(8) drops the caller's `PATH`, so
//!   `braid` must be in the shell's default one (`/usr/local/bin`, `/usr/bin`).
//!
//! Either way `-o` holds mount(8)'s and fstab's own options beside braid's (mount.fuse
//! adds `dev,suid`; a `user` entry adds `noexec,nosuid,nodev`): this module drops those
//! that mean nothing to a braid mount, lets [`mount::parse_options`] judge the rest, and
//! runs `braid mount` in the background: a helper must return once the file system is
//! mounted, and the mount process stays behind to serve it.
//!
//! Exit statuses are mount(8)'s: 1 for a wrong call or option, 32 for a mount that
//! failed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::mount::{self, MountArgs};

/// Names the binary has when mount(8) runs it as a helper.
const HELPER_NAMES: [&str; 2] = ["mount.fuse.braid", "mount.braid"];

/// Options mount(8) and fstab pass that are no settings of a braid mount:
/// - bookkeeping that mount(8), systemd or fstab act on before a helper runs;
/// - `dev`, `suid` and their negations: a braid mount is always `nodev,nosuid`
///   (mount.fuse adds `dev,suid` to every call it does not see them negated in);
/// - the atime family: braid never updates atime on reads, as with `noatime`;
/// - `async`: writes are asynchronous until `fsync`, as on any file system.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "_netdev",
    "nofail",
    "user",
    "nouser",
    "users",
    "nousers",
    "owner",
    "noowner",
    "group",
    "nogroup",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "async",
];

/// Prefixes of options for fstab's readers only (`x-systemd.requires=...`,
/// `comment=...`); mount(8) keeps most of them from helpers, `braid SOURCE ...` run by
/// hand may still carry them.
const IGNORED_PREFIXES: &[&str] = &["x-", "X-", "comment="];

/// mount(8)'s exit status for a wrong call or option.
pub const EXIT_USAGE: i32 = 1;
/// mount(8)'s exit status for a mount that failed.
pub const EXIT_MOUNT_FAILED: i32 = 32;

/// A helper run that failed: what to say and the exit status mount(8) expects.
#[derive(Debug)]
pub struct Failure {
    pub exit_code: i32,
    pub error: anyhow::Error,
}

/// Whether this process was started as a mount helper: under a helper's name, or as
/// `braid SOURCE MOUNTPOINT ...` with a braid source (how mount.fuse runs it; no
/// subcommand looks like `braid://` or `braid@`).
pub fn invoked_as_helper(args: &[OsString]) -> bool {
    let name = args.first().map(Path::new).and_then(Path::file_name).and_then(|n| n.to_str());
    name.is_some_and(|n| HELPER_NAMES.contains(&n)) || args.get(1).and_then(|a| a.to_str()).is_some_and(is_source)
}

fn is_source(s: &str) -> bool {
    s.starts_with("braid://") || s.starts_with("braid@")
}

/// A helper call as mount(8) or mount.fuse makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// `braid://MGS/`.
    pub url: String,
    pub mountpoint: PathBuf,
    /// The `-o` options, every list joined.
    pub options: Vec<String>,
    /// `-f`: mount(8)'s "fake" (check everything, mount nothing), not braid's foreground.
    pub fake: bool,
    /// `-s`: drop options braid does not know instead of refusing them.
    pub sloppy: bool,
    /// `-v`: say what is run.
    pub verbose: bool,
}

/// Parses the arguments after the program name:
/// `SOURCE MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS] [-t TYPE]`.
pub fn parse(args: &[String]) -> Result<HelperCall> {
    let mut positional = Vec::new();
    let mut call = HelperCall {
        url: String::new(),
        mountpoint: PathBuf::new(),
        options: Vec::new(),
        fake: false,
        sloppy: false,
        verbose: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => call.options.extend(it.next().context("-o needs a list of options")?.split(',').map(String::from)),
            "-t" => {
                let t = it.next().context("-t needs a file system type")?;
                if !matches!(t.as_str(), "fuse.braid" | "braid" | "fuse") {
                    bail!("file system type {t}: this helper mounts fuse.braid");
                }
            }
            "-N" => bail!("-N: braid's mount helper cannot mount in another namespace; run mount(8) inside it"),
            "-h" | "--help" => bail!("{}", usage()),
            flags if flags.starts_with('-') && flags.len() > 1 => {
                for f in flags[1..].chars() {
                    match f {
                        'f' => call.fake = true,
                        's' => call.sloppy = true,
                        'v' => call.verbose = true,
                        // No mtab to leave alone: /etc/mtab is the kernel's list.
                        'n' => {}
                        _ => bail!("unknown flag -{f} ({})", usage()),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|p| anyhow::anyhow!("want a source and a mount point, got {} arguments ({})", p.len(), usage()))?;
    call.url = source_url(&source)?;
    call.mountpoint = PathBuf::from(mountpoint);
    Ok(call)
}

fn usage() -> String {
    "usage: mount.fuse.braid braid://HOST:PORT/ MOUNTPOINT [-sfnv] [-o OPTIONS], as mount(8) runs it".into()
}

/// The cluster's URL from a mount source: `braid://HOST:PORT/`, or `braid@HOST:PORT`
/// as `/proc/mounts` shows a braid mount's source.
fn source_url(source: &str) -> Result<String> {
    let url = match source.strip_prefix("braid@") {
        Some(mgs) => format!("braid://{mgs}/"),
        None => source.to_string(),
    };
    let p = crate::url::require(&url).with_context(|| format!("mount source {source}"))?;
    if p.path != "/" {
        bail!("mount source {source}: mounting a subdirectory is not supported; mount braid://{}/", p.mgs);
    }
    Ok(p.url())
}

/// The options of `call` that go to `braid mount`: mount(8)'s own dropped and, for a
/// sloppy call, those braid does not know (each said on stderr).
pub fn braid_options(call: &HelperCall) -> Vec<String> {
    let mut kept = Vec::new();
    for opt in call.options.iter().filter(|o| !o.is_empty()) {
        let key = opt.split_once('=').map_or(opt.as_str(), |(k, _)| k);
        if IGNORED.contains(&opt.as_str()) || IGNORED_PREFIXES.iter().any(|p| opt.starts_with(p)) {
            if call.verbose {
                eprintln!("mount.fuse.braid: option {opt} means nothing to a braid mount; ignored");
            }
        } else if call.sloppy && !mount::OPTION_KEYS.contains(&key) {
            eprintln!("mount.fuse.braid: unknown option {opt} dropped (sloppy mount, -s)");
        } else {
            kept.push(opt.clone());
        }
    }
    kept
}

/// Runs the helper: `args` is this process's whole command line.
pub fn run(args: &[OsString]) -> Result<(), Failure> {
    let usage_error = |error| Failure { exit_code: EXIT_USAGE, error };
    let args: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.clone().into_string().map_err(|a| anyhow::anyhow!("argument {a:?} is not UTF-8")))
        .collect::<Result<_>>()
        .map_err(usage_error)?;
    let call = parse(&args).map_err(usage_error)?;
    let options = braid_options(&call);
    // Wrong options are a wrong call, said before anything is tried.
    let settings = mount::parse_options(&options).map_err(usage_error)?;
    mount::no_page_cache(&settings).map_err(usage_error)?;
    let list = options.join(",");
    if call.verbose {
        eprintln!("mount.fuse.braid: braid mount {} {} -o {list}", call.url, call.mountpoint.display());
    }
    if call.fake {
        return mount::check_mount_point(&call.mountpoint)
            .map_err(|error| Failure { exit_code: EXIT_MOUNT_FAILED, error });
    }
    let a = MountArgs {
        url: call.url,
        mountpoint: call.mountpoint,
        foreground: false,
        options: if list.is_empty() { vec![] } else { vec![list] },
        secret_file: None,
        log: None,
    };
    let no_secret = settings.secret_file.is_none() && std::env::var_os("BRAID_SECRET_FILE").is_none();
    mount::run(a).map_err(|error| {
        // mount(8) has no --secret-file to suggest: say the option that gives it.
        let error = if no_secret && format!("{error:#}").contains("secret") {
            error.context("no secret_file= among the options (a cluster with a secret needs secret_file=FILE)")
        } else {
            error
        };
        Failure { exit_code: EXIT_MOUNT_FAILED, error }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn who_is_a_helper() {
        assert!(invoked_as_helper(&os(&["/sbin/mount.fuse.braid", "braid://h:1/", "/mnt"])));
        assert!(invoked_as_helper(&os(&["mount.braid", "x", "/mnt"])), "by name, whatever the source");
        assert!(invoked_as_helper(&os(&["/usr/local/bin/braid", "braid://h:1/", "/mnt", "-o", "rw"])));
        assert!(invoked_as_helper(&os(&["braid", "braid@h:1", "/mnt"])));
        assert!(!invoked_as_helper(&os(&["braid", "mount", "braid://h:1/", "/mnt"])));
        assert!(!invoked_as_helper(&os(&["braid"])));
        assert!(!invoked_as_helper(&os(&["/usr/local/bin/braid", "ls", "braid://h:1/"])));
    }

    /// The calls mount(8) 2.38 and fuse 3.14's mount.fuse made in this repository's
    /// test machine for `mount -t fuse.braid braid://127.0.0.1:9400/ DIR -o ...`.
    #[test]
    fn the_calls_mount_and_mount_fuse_make() {
        // mount(8) running /sbin/mount.fuse.braid, from an fstab line with `user`.
        let c = parse(&strings(&[
            "braid://127.0.0.1:9400/",
            "/mnt/braid",
            "-o",
            "ro,noatime,nosuid,noexec,nodev,secret_file=/etc/x,_netdev,nofail,user",
        ]))
        .unwrap();
        assert_eq!(c.url, "braid://127.0.0.1:9400/");
        assert_eq!(c.mountpoint, PathBuf::from("/mnt/braid"));
        assert_eq!(braid_options(&c), strings(&["ro", "noexec", "secret_file=/etc/x"]));
        let s = mount::parse_options(&braid_options(&c)).unwrap();
        assert!(s.fuse.read_only && s.fuse.no_exec);
        assert_eq!(s.secret_file, Some(PathBuf::from("/etc/x")));
        // mount.fuse running `braid SOURCE MOUNTPOINT -o OPTIONS`: it adds dev,suid.
        let c = parse(&strings(&["braid://h:9400/", "/m", "-o", "rw,noatime,secret_file=/s,dev,suid"])).unwrap();
        assert_eq!(braid_options(&c), strings(&["rw", "secret_file=/s"]));
        // mount(8)'s flags, and -t as it passes it to helpers of other names.
        let c =
            parse(&strings(&["braid@h:9400", "/m", "-s", "-f", "-n", "-v", "-o", "rw", "-t", "fuse.braid"])).unwrap();
        assert_eq!(c.url, "braid://h:9400/", "the source /proc/mounts shows");
        assert!(c.fake && c.sloppy && c.verbose);
        assert!(parse(&strings(&["braid://h:9400/", "/m", "-fv"])).unwrap().fake);
    }

    #[test]
    fn wrong_calls_are_refused_with_what_to_do() {
        let err = |a: &[&str]| format!("{:#}", parse(&strings(a)).unwrap_err());
        assert!(err(&["braid://h:9400/"]).contains("a source and a mount point"));
        assert!(err(&["braid://h:9400/", "/m", "/n"]).contains("got 3 arguments"));
        assert!(err(&["braid://h:9400/sub", "/m"]).contains("mounting a subdirectory is not supported"));
        assert!(err(&["nfs-server:/x", "/m"]).contains("not a braid path"));
        assert!(err(&["braid://h:9400/", "/m", "-t", "ext4"]).contains("this helper mounts fuse.braid"));
        assert!(err(&["braid://h:9400/", "/m", "-o"]).contains("-o needs"));
        assert!(err(&["braid://h:9400/", "/m", "-N", "/proc/1/ns/mnt"]).contains("namespace"));
        assert!(err(&["braid://h:9400/", "/m", "-x"]).contains("unknown flag -x"));
    }

    #[test]
    fn unknown_options_fail_unless_sloppy() {
        let c = parse(&strings(&["braid://h:9400/", "/m", "-o", "rw,sync,x-systemd.automount,comment=a"])).unwrap();
        assert_eq!(braid_options(&c), strings(&["rw", "sync"]));
        let e = mount::parse_options(&braid_options(&c)).unwrap_err().to_string();
        assert!(e.contains("unknown mount option 'sync'"), "{e}");
        let sloppy = HelperCall { sloppy: true, ..c };
        assert_eq!(braid_options(&sloppy), strings(&["rw"]));
        // A known option with a wrong value is not dropped by -s: it is wrong, not foreign.
        let c = parse(&strings(&["braid://h:9400/", "/m", "-s", "-o", "threads=x"])).unwrap();
        assert!(mount::parse_options(&braid_options(&c)).is_err());
    }

    #[test]
    fn a_run_with_bad_options_says_so_with_mounts_usage_status() {
        let f = run(&os(&["mount.fuse.braid", "braid://127.0.0.1:1/", "/", "-o", "bogus"])).unwrap_err();
        assert_eq!(f.exit_code, EXIT_USAGE);
        assert!(f.error.to_string().contains("unknown mount option 'bogus'"), "{:#}", f.error);
        let f = run(&os(&["mount.fuse.braid", "braid://127.0.0.1:1/", "/", "-o", "secret_file="])).unwrap_err();
        assert!(f.error.to_string().contains("secret_file needs a file"), "{:#}", f.error);
        // A fake mount checks the mount point and mounts nothing.
        let f = run(&os(&["mount.fuse.braid", "braid://127.0.0.1:1/", "/nonexistent-braid-mnt", "-f"])).unwrap_err();
        assert_eq!(f.exit_code, EXIT_MOUNT_FAILED);
        assert!(f.error.to_string().contains("does not exist"), "{:#}", f.error);
        let dir = std::env::temp_dir();
        run(&os(&["mount.fuse.braid", "braid://127.0.0.1:1/", dir.to_str().unwrap(), "-f", "-o", "rw,_netdev"]))
            .expect("a fake mount of an existing directory succeeds without asking the cluster");
    }
}
