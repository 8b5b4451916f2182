//! `braid migrate -m MDT PATH` (Lustre's `lfs migrate -m`): a directory tree's
//! inodes moved to another MDT, directories with their entries, files with their
//! Data-on-MDT bytes, while clients use them.
//!
//! The tree is walked bottom-up and each inode moves in one operation across two
//! MDTs (`Request::MdsMigrate`, crash-safe as the other operations spanning MDTs):
//! a directory's files first, then (once its subdirectories have moved too) the
//! directory, its parent's entry naming it under its new FID. A file keeps its OST
//! objects where they are: its layout names them by the FID it had
//! (`Layout::objects`). A walk killed anywhere leaves a whole namespace in which some
//! inodes moved and the others did not; running it again moves the rest (an inode
//! on the MDT already is passed over).
//!
//! A file with several links, open, or with more Data-on-MDT bytes than one step
//! carries stays where it is (`EMLINK`, `EBUSY`, `ENOSPC`): its entry moves with its
//! directory and names it on its MDT, as a rename across MDTs leaves one; the walk
//! says which. An inode changed while its copy was made
//! answers `EAGAIN` and is tried again.
//!
//! `--speed-limit N` moves at most N inodes a second (as LFSCK's `--speed`), so the
//! move leaves the MDTs to the file system's users; unlimited by default, as Lustre's.
//!
//! Clients keep using the tree meanwhile: a request naming an inode that moved (a
//! name a mount's kernel keeps, a working directory, a file's handle) is answered
//! with where it went, and the client sends it there (`Response::Moved`).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use client::{BlockingClient, Errno, Fid, FileKind};

use crate::tools::{creds, with_client, Pace};
use crate::ClientOpts;

/// How often one directory is tried again while it keeps changing under the copy.
const TRIES: u32 = 50;

/// The options of `braid migrate -m`.
#[derive(Debug, PartialEq)]
struct Options {
    mdt: u32,
    path: String,
    verbose: bool,
    /// Most inodes moved a second (`--speed-limit`); 0: as fast as the MDTs go.
    speed_limit: u64,
    secret_file: Option<std::path::PathBuf>,
    timeout_s: u64,
}

/// Whether `args` ask for a migration between MDTs (`-m`, `--mdt-index`, `--mdt`).
pub fn wanted(args: &[String]) -> bool {
    args.iter().any(|a| matches!(a.as_str(), "-m" | "--mdt-index" | "--mdt") || a.starts_with("--mdt-index="))
}

fn parse(args: &[String]) -> Result<Options> {
    let (mut mdt, mut path, mut verbose, mut secret_file, mut timeout_s) = (None, None, false, None, 60);
    let mut speed_limit = 0;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().cloned().with_context(|| format!("{a} needs {what}"));
        match a.as_str() {
            "-m" | "--mdt-index" | "--mdt" => {
                let v = value("an MDT index")?;
                mdt = Some(v.parse::<u32>().with_context(|| format!("{a} {v}: not an MDT index"))?);
            }
            s if s.starts_with("--mdt-index=") => {
                let v = &s["--mdt-index=".len()..];
                mdt = Some(v.parse::<u32>().with_context(|| format!("{s}: not an MDT index"))?);
            }
            "-v" | "--verbose" => verbose = true,
            "--speed-limit" => {
                let v = value("inodes a second")?;
                speed_limit =
                    v.parse().with_context(|| format!("--speed-limit {v}: not a number of inodes a second"))?;
            }
            "--secret-file" => secret_file = Some(value("a file")?.into()),
            "--timeout-s" => {
                let v = value("seconds")?;
                timeout_s = v.parse().with_context(|| format!("--timeout-s {v}: not a number of seconds"))?;
            }
            s if s.starts_with('-') => {
                bail!("braid migrate -m: unknown option {s} (layout options move bytes: run them separately)")
            }
            p if path.is_none() => path = Some(p.to_string()),
            p => bail!("braid migrate -m takes one path (got {p} too)"),
        }
    }
    let mdt = mdt.context("braid migrate -m needs an MDT index")?;
    let path = path.context("braid migrate -m needs a directory or file")?;
    Ok(Options { mdt, path, verbose, speed_limit, secret_file, timeout_s })
}

/// An inode to move: its entry (`name` in `parent`) and where the walk found it.
struct Item {
    parent: Fid,
    name: String,
    fid: Fid,
    kind: FileKind,
    path: String,
}

/// What a walk did.
#[derive(Default)]
struct Tally {
    dirs: usize,
    files: usize,
    there: usize,
    stayed: usize,
}

/// Runs `braid migrate -m MDT PATH`.
pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let opts = ClientOpts { secret_file: o.secret_file.clone(), timeout_s: o.timeout_s };
    with_client(&opts, &o.path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let top = bc.run(client.resolve(&c, &p.path, false)).map_err(|e| e.at(&p.url()))?;
        if top.fid == Fid::ROOT {
            bail!("{}: the root stays on MDT 0", p.url());
        }
        let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
        let top = Item { parent: parent.fid, name, fid: top.fid, kind: top.kind, path: p.url() };
        let mut order = Vec::new();
        match top.kind {
            FileKind::Dir => walk(bc, top, &mut order)?,
            _ => order.push(top),
        }
        let mut t = Tally::default();
        let mut pace = Pace::new(o.speed_limit);
        for item in &order {
            if item.fid.mdt() == o.mdt {
                t.there += 1;
                continue;
            }
            bc.run(pace.took(1));
            let attr = match migrate_one(bc, item, o.mdt)? {
                Moved::To(a) => a,
                Moved::Stayed => {
                    t.stayed += 1;
                    continue;
                }
                // Removed since the walk listed it: nothing to move.
                Moved::Gone if item.kind != FileKind::Dir => continue,
                Moved::Gone => bail!("{}: removed while it was migrated", item.path),
            };
            match item.kind {
                FileKind::Dir => t.dirs += 1,
                _ => t.files += 1,
            }
            if o.verbose {
                println!("{}: {} -> {} (MDT {})", item.path, item.fid, attr.fid, attr.fid.mdt());
            }
        }
        let stayed = match t.stayed {
            0 => String::new(),
            n => format!(", {n} files stay where they are (see above)"),
        };
        println!(
            "{}: {} directories and {} files moved to MDT {}, {} there already{stayed}",
            p.url(),
            t.dirs,
            t.files,
            o.mdt,
            t.there
        );
        Ok(())
    })
}

/// `d` and every inode below it, deepest first: a directory after its files and
/// subdirectories.
fn walk(bc: &BlockingClient, d: Item, order: &mut Vec<Item>) -> Result<()> {
    let c = creds();
    let entries = bc.run(bc.client.readdir_all(&c, d.fid)).map_err(|e| e.at(&d.path))?;
    for e in entries {
        if e.name == "." || e.name == ".." {
            continue;
        }
        let path = format!("{}/{}", d.path.trim_end_matches('/'), e.name);
        let item = Item { parent: d.fid, name: e.name, fid: e.fid, kind: e.kind, path };
        match item.kind {
            FileKind::Dir => walk(bc, item, order)?,
            _ => order.push(item),
        }
    }
    order.push(d);
    Ok(())
}

/// What became of one inode.
enum Moved {
    /// Where it is now.
    To(client::Attr),
    /// A file with several links, open, or with more bytes on the MDT than one step
    /// carries: it stays (said on stderr).
    Stayed,
    /// Its entry is gone (`ENOENT`).
    Gone,
}

/// Moves one inode, trying again while it keeps changing under the copy.
fn migrate_one(bc: &BlockingClient, item: &Item, mdt: u32) -> Result<Moved> {
    let c = creds();
    let mut pause = Duration::from_millis(20);
    for _ in 1..TRIES {
        match bc.run(bc.client.migrate_mdt(&c, item.parent, &item.name, mdt)) {
            Ok(a) => return Ok(Moved::To(a)),
            Err(e) if e.errno() == Errno::Again => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) if item.kind != FileKind::Dir && matches!(e.errno(), Errno::MLink | Errno::Busy | Errno::NoSpc) => {
                eprintln!("{}: stays on MDT {}: {e}", item.path, item.fid.mdt());
                return Ok(Moved::Stayed);
            }
            Err(e) if e.errno() == Errno::NoEnt => return Ok(Moved::Gone),
            Err(e) => bail!("{}: {e}", item.path),
        }
    }
    let last = bc.run(bc.client.migrate_mdt(&c, item.parent, &item.name, mdt));
    last.map(Moved::To).map_err(|e| anyhow::anyhow!("{}: still changing after {TRIES} tries: {e}", item.path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_are_parsed_and_bad_ones_named() {
        let o = parse(&args("-m 1 -v /mnt/braid/proj")).unwrap();
        assert_eq!((o.mdt, o.path.as_str(), o.verbose, o.speed_limit), (1, "/mnt/braid/proj", true, 0));
        assert_eq!(parse(&args("-m 0 --speed-limit 500 d")).unwrap().speed_limit, 500);
        assert_eq!(parse(&args("--mdt-index=2 d")).unwrap().mdt, 2);
        assert!(wanted(&args("--mdt 0 d")) && !wanted(&args("-c 2 f")));
        let err = |s: &str| format!("{:#}", parse(&args(s)).unwrap_err());
        assert!(err("-m x d").contains("not an MDT index"));
        assert!(err("-m 1 --speed-limit fast d").contains("not a number of inodes a second"));
        assert!(err("-m").contains("needs an MDT index"));
        assert!(err("-m 1").contains("needs a directory or file"));
        assert!(err("-m 1 -c 2 d").contains("unknown option -c"));
        assert!(err("-m 1 a b").contains("one path"));
    }
}
