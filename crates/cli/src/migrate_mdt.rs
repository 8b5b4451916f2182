//! `braid migrate -m MDT DIR` (Lustre's `lfs migrate -m`): a directory tree's
//! directories moved to another MDT, with their entries, while clients use them.
//!
//! The tree is walked bottom-up and each directory moves in one operation across two
//! MDTs (`Request::MdsMigrateDir`, crash-safe as the other operations spanning MDTs):
//! once a directory's subdirectories have moved, it can move too, its parent's entry
//! naming it under its new FID. A walk killed anywhere leaves a whole namespace in
//! which some directories moved and the others did not; running it again moves the
//! rest (a directory on the MDT already is passed over).
//!
//! Files keep their inodes where they are for now: their entries move with their
//! directory and name them on their MDT (as Lustre leaves hard-linked files). A
//! directory changed while its copy was made answers `EAGAIN` and is tried again.
//!
//! Clients keep using the tree meanwhile: a request naming a directory that moved
//! (a name a mount's kernel keeps, a working directory) is answered with where it
//! went, and the client sends it there (`Response::Moved`).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use client::{BlockingClient, Errno, Fid, FileKind};

use crate::tools::{creds, with_client};
use crate::ClientOpts;

/// How often one directory is tried again while it keeps changing under the copy.
const TRIES: u32 = 50;

/// The options of `braid migrate -m`.
#[derive(Debug, PartialEq)]
struct Options {
    mdt: u32,
    path: String,
    verbose: bool,
    secret_file: Option<std::path::PathBuf>,
    timeout_s: u64,
}

/// Whether `args` ask for a migration between MDTs (`-m`, `--mdt-index`, `--mdt`).
pub fn wanted(args: &[String]) -> bool {
    args.iter().any(|a| matches!(a.as_str(), "-m" | "--mdt-index" | "--mdt") || a.starts_with("--mdt-index="))
}

fn parse(args: &[String]) -> Result<Options> {
    let (mut mdt, mut path, mut verbose, mut secret_file, mut timeout_s) = (None, None, false, None, 60);
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
            "--secret-file" => secret_file = Some(value("a file")?.into()),
            "--timeout-s" => {
                let v = value("seconds")?;
                timeout_s = v.parse().with_context(|| format!("--timeout-s {v}: not a number of seconds"))?;
            }
            s if s.starts_with('-') => {
                bail!("braid migrate -m: unknown option {s} (layout options move bytes: run them separately)")
            }
            p if path.is_none() => path = Some(p.to_string()),
            p => bail!("braid migrate -m takes one directory (got {p} too)"),
        }
    }
    let mdt = mdt.context("braid migrate -m needs an MDT index")?;
    let path = path.context("braid migrate -m needs a directory")?;
    Ok(Options { mdt, path, verbose, secret_file, timeout_s })
}

/// A directory to move: its entry (`name` in `parent`) and where the walk found it.
struct Dir {
    parent: Fid,
    name: String,
    fid: Fid,
    path: String,
}

/// Runs `braid migrate -m MDT DIR`.
pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let opts = ClientOpts { secret_file: o.secret_file.clone(), timeout_s: o.timeout_s };
    with_client(&opts, &o.path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let top = bc.run(client.resolve(&c, &p.path, false)).map_err(|e| e.at(&p.url()))?;
        if top.kind != FileKind::Dir {
            bail!("{}: braid migrate -m moves directories; a file's bytes move with braid migrate -p/-c", p.url());
        }
        if top.fid == Fid::ROOT {
            bail!("{}: the root stays on MDT 0", p.url());
        }
        let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
        let mut order = Vec::new();
        walk(bc, Dir { parent: parent.fid, name, fid: top.fid, path: p.url() }, &mut order)?;
        let (mut moved, mut there) = (0usize, 0usize);
        for d in &order {
            if d.fid.mdt() == o.mdt {
                there += 1;
                continue;
            }
            let attr = migrate_one(bc, d, o.mdt)?;
            moved += 1;
            if o.verbose {
                println!("{}: {} -> {} (MDT {})", d.path, d.fid, attr.fid, attr.fid.mdt());
            }
        }
        println!("{}: {moved} directories moved to MDT {}, {there} there already", p.url(), o.mdt);
        Ok(())
    })
}

/// `d` and every directory below it, deepest first (a directory after its
/// subdirectories).
fn walk(bc: &BlockingClient, d: Dir, order: &mut Vec<Dir>) -> Result<()> {
    let c = creds();
    let entries = bc.run(bc.client.readdir_all(&c, d.fid)).map_err(|e| e.at(&d.path))?;
    for e in entries {
        if e.kind == FileKind::Dir && e.name != "." && e.name != ".." {
            let path = format!("{}/{}", d.path.trim_end_matches('/'), e.name);
            walk(bc, Dir { parent: d.fid, name: e.name, fid: e.fid, path }, order)?;
        }
    }
    order.push(d);
    Ok(())
}

/// Moves one directory, trying again while it keeps changing under the copy.
fn migrate_one(bc: &BlockingClient, d: &Dir, mdt: u32) -> Result<client::Attr> {
    let c = creds();
    let mut pause = Duration::from_millis(20);
    for _ in 1..TRIES {
        match bc.run(bc.client.migrate_dir(&c, d.parent, &d.name, mdt)) {
            Err(e) if e.errno() == Errno::Again => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            r => return r.map_err(|e| anyhow::anyhow!("{}: {}", d.path, e)),
        }
    }
    let last = bc.run(bc.client.migrate_dir(&c, d.parent, &d.name, mdt));
    last.map_err(|e| anyhow::anyhow!("{}: still changing after {TRIES} tries: {e}", d.path))
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
        assert_eq!((o.mdt, o.path.as_str(), o.verbose), (1, "/mnt/braid/proj", true));
        assert_eq!(parse(&args("--mdt-index=2 d")).unwrap().mdt, 2);
        assert!(wanted(&args("--mdt 0 d")) && !wanted(&args("-c 2 f")));
        let err = |s: &str| format!("{:#}", parse(&args(s)).unwrap_err());
        assert!(err("-m x d").contains("not an MDT index"));
        assert!(err("-m").contains("needs an MDT index"));
        assert!(err("-m 1").contains("needs a directory"));
        assert!(err("-m 1 -c 2 d").contains("unknown option -c"));
        assert!(err("-m 1 a b").contains("one directory"));
    }
}
