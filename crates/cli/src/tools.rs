//! The command-line tools over the native client (`cp`, `ls`, `rm`, `mkdir`, `stat`,
//! `df`), as Lustre's `lfs` and `lctl` are; `setstripe` and `getstripe` are in `stripe`.

use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use client::Errno;
use client::{Attr, Creds, FileKind, OpenFlags, TargetKind, Timespec};
use client::{BlockingClient, Client};

use crate::url::BraidPath;
use crate::ClientOpts;

/// Transfer unit of `cp`: big enough to keep every OST of a wide file busy.
const CP_CHUNK: usize = 32 << 20;

fn connect(opts: &ClientOpts, mgs: &str) -> Result<BlockingClient> {
    let file = opts.secret_file.clone().or_else(|| {
        if std::env::var_os("BRAID_SECRET_FILE").is_some() {
            None
        } else {
            crate::mount::recorded_secret(mgs)
        }
    });
    let secret = crate::client_secret(&file)?;
    crate::mount::native_client(mgs, secret, Some(Duration::from_secs(opts.timeout_s)))
}

pub(crate) fn creds() -> Creds {
    client::process_creds()
}

// ---- cp ----

struct Progress {
    name: String,
    total: u64,
    done: u64,
    start: Instant,
    last: Instant,
    enabled: bool,
}

impl Progress {
    fn new(name: &str, total: u64) -> Progress {
        let now = Instant::now();
        Progress {
            name: name.to_string(),
            total,
            done: 0,
            start: now,
            last: now,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if self.enabled && self.last.elapsed() > Duration::from_millis(200) {
            self.last = Instant::now();
            self.draw();
        }
    }

    fn draw(&self) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let pct = if self.total == 0 { 100.0 } else { self.done as f64 * 100.0 / self.total as f64 };
        let bar = (pct / 5.0) as usize;
        eprint!(
            "\r{:30.30} [{:<20}] {:5.1}% {:>9} {:8.1} MiB/s",
            self.name,
            "#".repeat(bar.min(20)),
            pct,
            layout::format_size(self.done),
            self.done as f64 / secs / 1048576.0
        );
    }

    fn finish(&self) {
        if self.enabled {
            self.draw();
            eprintln!();
        }
    }
}

fn base_name(p: &str) -> Result<String> {
    let name = p.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    if name.is_empty() || name == "." || name == ".." {
        bail!("{p}: cannot tell the file name");
    }
    Ok(name.to_string())
}

pub fn cp(opts: &ClientOpts, paths: &[String]) -> Result<()> {
    let (srcs, dst) = paths.split_at(paths.len() - 1);
    let dst = &dst[0];
    let mut clients: HashMap<String, BlockingClient> = HashMap::new();
    let mut get = |mgs: &str| -> Result<Client> {
        if !clients.contains_key(mgs) {
            clients.insert(mgs.to_string(), connect(opts, mgs)?);
        }
        Ok(clients[mgs].client.clone())
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let c = creds();
    let dst_b = BraidPath::parse(dst)?;
    let many = srcs.len() > 1;
    for src in srcs {
        let src_b = BraidPath::parse(src)?;
        match (src_b, &dst_b) {
            (None, None) => bail!("neither {src} nor {dst} is a braid:// path; use cp(1)"),
            (None, Some(d)) => {
                let client = get(&d.mgs)?;
                rt.block_on(upload(&client, &c, Path::new(src), d, many))?;
            }
            (Some(s), None) => {
                let client = get(&s.mgs)?;
                rt.block_on(download(&client, &c, &s, Path::new(dst), many))?;
            }
            (Some(s), Some(d)) => {
                let (sc, dc) = (get(&s.mgs)?, get(&d.mgs)?);
                rt.block_on(copy_within(&sc, &dc, &c, &s, d, many))?;
            }
        }
    }
    Ok(())
}

/// Where a copy lands: into the directory `dst` names, or at `dst` itself.
async fn target_path(client: &Client, c: &Creds, dst: &BraidPath, src_name: &str, many: bool) -> Result<BraidPath> {
    match client.resolve(c, &dst.path, true).await {
        Ok(a) if a.kind == FileKind::Dir => Ok(dst.join(src_name)),
        Ok(_) if many => bail!("{}: not a directory (copying several files)", dst.url()),
        Ok(_) => Ok(dst.clone()),
        Err(e) if e.errno() == Errno::NoEnt && !many => Ok(dst.clone()),
        Err(e) => Err(e.into()),
    }
}

async fn create_for_write(client: &Client, c: &Creds, p: &BraidPath) -> Result<client::OpenFile> {
    let (parent, name) = client.resolve_parent(c, &p.path).await?;
    let flags = OpenFlags { read: false, write: true, truncate: true };
    let (f, _, _) = client.create(c, parent.fid, &name, 0o644, false, flags, None).await.map_err(|e| e.at(&p.url()))?;
    Ok(f)
}

async fn upload(client: &Client, c: &Creds, src: &Path, dst: &BraidPath, many: bool) -> Result<()> {
    let meta = std::fs::metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
    if meta.is_dir() {
        bail!("{}: is a directory (copying directories is not supported)", src.display());
    }
    let target = target_path(client, c, dst, &base_name(&src.to_string_lossy())?, many).await?;
    let f = create_for_write(client, c, &target).await?;
    let mut file = std::fs::File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
    // A reader thread keeps the next chunk ready while this one is on the wire.
    let (tx, rx) = mpsc::sync_channel::<std::io::Result<Vec<u8>>>(2);
    let reader = std::thread::spawn(move || loop {
        let mut buf = vec![0u8; CP_CHUNK];
        let mut n = 0;
        while n < buf.len() {
            match file.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
        buf.truncate(n);
        let last = n == 0;
        if tx.send(Ok(buf)).is_err() || last {
            return;
        }
    });
    let mut progress = Progress::new(&target.path, meta.len());
    let mut offset = 0u64;
    for chunk in rx {
        let chunk = chunk.with_context(|| format!("cannot read {}", src.display()))?;
        if chunk.is_empty() {
            break;
        }
        let n = chunk.len() as u64;
        client.write(&f, offset, Bytes::from(chunk)).await.map_err(|e| e.at(&target.url()))?;
        offset += n;
        progress.add(n);
    }
    let _ = reader.join();
    client.close(f).await.map_err(|e| e.at(&target.url()))?;
    progress.finish();
    Ok(())
}

async fn open_for_read(client: &Client, c: &Creds, src: &BraidPath) -> Result<(client::OpenFile, Attr)> {
    let attr = client.resolve(c, &src.path, true).await.map_err(|e| e.at(&src.url()))?;
    if attr.kind == FileKind::Dir {
        bail!("{}: is a directory (copying directories is not supported)", src.url());
    }
    let flags = OpenFlags { read: true, write: false, truncate: false };
    Ok(client.open(c, attr.fid, flags).await.map_err(|e| e.at(&src.url()))?)
}

async fn download(client: &Client, c: &Creds, src: &BraidPath, dst: &Path, many: bool) -> Result<()> {
    let (f, attr) = open_for_read(client, c, src).await?;
    let target = if dst.is_dir() {
        dst.join(base_name(&src.path)?)
    } else if many {
        bail!("{}: not a directory (copying several files)", dst.display());
    } else {
        dst.to_path_buf()
    };
    let mut out = std::fs::File::create(&target).with_context(|| format!("cannot create {}", target.display()))?;
    let (tx, rx) = mpsc::sync_channel::<Bytes>(2);
    let path = target.clone();
    let writer = std::thread::spawn(move || -> Result<()> {
        for chunk in rx {
            out.write_all(&chunk).with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    });
    let mut progress = Progress::new(&src.path, attr.size);
    let mut offset = 0;
    while offset < attr.size {
        let data = client.read(&f, offset, CP_CHUNK as u64).await.map_err(|e| e.at(&src.url()))?;
        if data.is_empty() {
            break;
        }
        offset += data.len() as u64;
        progress.add(data.len() as u64);
        if tx.send(data).is_err() {
            break;
        }
    }
    drop(tx);
    writer.join().map_err(|_| anyhow::anyhow!("writer thread failed"))??;
    client.close(f).await?;
    progress.finish();
    Ok(())
}

async fn copy_within(sc: &Client, dc: &Client, c: &Creds, src: &BraidPath, dst: &BraidPath, many: bool) -> Result<()> {
    let (f, attr) = open_for_read(sc, c, src).await?;
    let target = target_path(dc, c, dst, &base_name(&src.path)?, many).await?;
    let out = create_for_write(dc, c, &target).await?;
    let mut progress = Progress::new(&target.path, attr.size);
    let mut offset = 0;
    while offset < attr.size {
        let data = sc.read(&f, offset, CP_CHUNK as u64).await?;
        if data.is_empty() {
            break;
        }
        let n = data.len() as u64;
        dc.write(&out, offset, data).await?;
        offset += n;
        progress.add(n);
    }
    sc.close(f).await?;
    dc.close(out).await?;
    progress.finish();
    Ok(())
}

// ---- namespace tools ----

/// A braid:// path, or a path inside a braid mount.
pub fn cluster_path(path: &str) -> Result<BraidPath> {
    if let Some(p) = BraidPath::parse(path)? {
        return Ok(p);
    }
    match crate::mount::resolve_mounted(path)? {
        Some(p) => Ok(p),
        None => bail!("{path}: neither a braid://HOST:PORT/path nor a path inside a braid mount"),
    }
}

/// Takes `--secret-file` and `--timeout-s` out of `args` (of a command that reads
/// its own arguments in order), and the rest.
pub(crate) fn take_client_opts(args: &[String]) -> Result<(ClientOpts, Vec<String>)> {
    let mut opts = ClientOpts { secret_file: None, timeout_s: 60 };
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value =
            || inline.clone().or_else(|| it.next().cloned()).with_context(|| format!("{flag} needs a value"));
        match flag {
            "--secret-file" => opts.secret_file = Some(value()?.into()),
            "--timeout-s" => {
                let v = value()?;
                opts.timeout_s = v.parse().with_context(|| format!("invalid --timeout-s '{v}'"))?;
            }
            _ => rest.push(a.clone()),
        }
    }
    Ok((opts, rest))
}

pub(crate) fn with_client<T>(
    opts: &ClientOpts,
    path: &str,
    f: impl FnOnce(&BlockingClient, &BraidPath) -> Result<T>,
) -> Result<T> {
    let p = cluster_path(path)?;
    let bc = connect(opts, &p.mgs)?;
    f(&bc, &p)
}

fn mode_string(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
        FileKind::Socket => 's',
    });
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o40, 'r'),
        (0o20, 'w'),
        (0o10, 'x'),
        (0o4, 'r'),
        (0o2, 'w'),
        (0o1, 'x'),
    ];
    for (i, (bit, ch)) in bits.iter().enumerate() {
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        let set = mode & bit != 0;
        s.push(match (set, special, i) {
            (true, false, _) => *ch,
            (false, false, _) => '-',
            (true, true, 8) => 't',
            (false, true, 8) => 'T',
            (true, true, _) => 's',
            (false, true, _) => 'S',
        });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
fn format_time(t: Timespec) -> String {
    let days = t.sec.div_euclid(86400);
    let secs = t.sec.rem_euclid(86400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

pub fn ls(opts: &ClientOpts, path: &str, long: bool) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let c = creds();
        let client = &bc.client;
        let attr = bc.run(client.resolve(&c, &p.path, true)).map_err(|e| e.at(&p.url()))?;
        let mut out = std::io::stdout().lock();
        let entries: Vec<(String, Option<Attr>)> = if attr.kind == FileKind::Dir {
            let mut list = bc.run(client.readdir_all(&c, attr.fid)).map_err(|e| e.at(&p.url()))?;
            list.sort_by(|a, b| a.name.cmp(&b.name));
            list.into_iter()
                .map(|e| {
                    let a = if long { bc.run(client.getattr(e.fid)).ok() } else { None };
                    (e.name, a)
                })
                .collect()
        } else {
            vec![(p.path.clone(), Some(attr))]
        };
        for (name, a) in entries {
            match (long, a) {
                (true, Some(a)) => writeln!(
                    out,
                    "{} {:>3} {:>5} {:>5} {:>12} {} {name}",
                    mode_string(a.kind, a.mode),
                    a.nlink,
                    a.uid,
                    a.gid,
                    a.size,
                    &format_time(a.mtime)[..16]
                )?,
                _ => writeln!(out, "{name}")?,
            }
        }
        Ok(())
    })
}

async fn remove_tree(client: &Client, c: &Creds, parent: client::Fid, name: &str, depth: usize) -> client::Result<()> {
    let attr = client.lookup(c, parent, name).await?;
    if attr.kind == FileKind::Dir {
        if depth > 256 {
            return Err(client::ClientError::Errno(Errno::Loop, "directory tree too deep".into()));
        }
        for e in client.readdir_all(c, attr.fid).await? {
            Box::pin(remove_tree(client, c, attr.fid, &e.name, depth + 1)).await?;
        }
        client.rmdir(c, parent, name).await
    } else {
        client.unlink(c, parent, name).await
    }
}

pub fn rm(opts: &ClientOpts, paths: &[String], recursive: bool) -> Result<()> {
    for path in paths {
        with_client(opts, path, |bc, p| {
            let c = creds();
            let client = &bc.client;
            let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
            let attr = bc.run(client.lookup(&c, parent.fid, &name)).map_err(|e| e.at(&p.url()))?;
            if attr.kind == FileKind::Dir && !recursive {
                bail!("{}: is a directory (use -r)", p.url());
            }
            bc.run(remove_tree(client, &c, parent.fid, &name, 0)).map_err(|e| e.at(&p.url()))?;
            Ok(())
        })?;
    }
    Ok(())
}

pub fn mkdir(opts: &ClientOpts, paths: &[String], parents: bool, spec: Option<client::DirSpec>) -> Result<()> {
    for path in paths {
        with_client(opts, path, |bc, p| {
            let c = creds();
            let client = &bc.client;
            if !parents {
                let (parent, name) = bc.run(client.resolve_parent(&c, &p.path))?;
                bc.run(client.mkdir_with(&c, parent.fid, &name, 0o755, spec)).map_err(|e| e.at(&p.url()))?;
                return Ok(());
            }
            let mut at = bc.run(client.getattr(client::Fid::ROOT))?;
            for comp in client::path::components(&p.path) {
                at = match bc.run(client.lookup(&c, at.fid, &comp)) {
                    Ok(a) if a.kind == FileKind::Dir => a,
                    Ok(_) => bail!("{}: {comp} exists and is not a directory", p.url()),
                    Err(e) if e.errno() == Errno::NoEnt => {
                        match bc.run(client.mkdir_with(&c, at.fid, &comp, 0o755, spec)) {
                            Ok(a) => a,
                            Err(e) if e.errno() == Errno::Exist => bc.run(client.lookup(&c, at.fid, &comp))?,
                            Err(e) => return Err(e.at(&p.url()).into()),
                        }
                    }
                    Err(e) => return Err(e.at(&p.url()).into()),
                };
            }
            Ok(())
        })?;
    }
    Ok(())
}

pub fn stat(opts: &ClientOpts, path: &str) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let a = bc.run(bc.client.resolve(&creds(), &p.path, false)).map_err(|e| e.at(&p.url()))?;
        let kind = match a.kind {
            FileKind::File => "regular file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symbolic link",
            FileKind::Fifo => "fifo",
            FileKind::CharDevice => "character special file",
            FileKind::BlockDevice => "block special file",
            FileKind::Socket => "socket",
        };
        println!("  File: {}", p.path);
        println!("  Size: {:<12} Type: {kind}", a.size);
        if a.kind.is_device() {
            // Linux's dev_t encoding: major in bits 8-19 (and 32+), minor in 0-7 and 20-31.
            let (major, minor) = ((a.rdev >> 8) & 0xfff, (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00));
            println!("Device type: {major},{minor}");
        }
        println!("   FID: {:<24} Inode: {:<20} Links: {}", a.fid.to_string(), a.fid.ino(), a.nlink);
        println!("Access: ({:04o}/{})  Uid: {:>5}  Gid: {:>5}", a.mode, mode_string(a.kind, a.mode), a.uid, a.gid);
        println!("Access: {}.{:09} UTC", format_time(a.atime), a.atime.nsec);
        println!("Modify: {}.{:09} UTC", format_time(a.mtime), a.mtime.nsec);
        println!("Change: {}.{:09} UTC", format_time(a.ctime), a.ctime.nsec);
        if let Some(l) = &a.layout {
            let c = &l.components[0];
            println!(
                "Layout: {} component(s), stripe_count {} stripe_size {}",
                l.components.len(),
                c.stripe_count(),
                c.stripe_size
            );
        }
        Ok(())
    })
}

fn human(kib: u64) -> String {
    layout::format_size(kib * 1024)
}

pub fn df(opts: &ClientOpts, path: &str, inodes: bool, human_units: bool, pool: Option<String>) -> Result<()> {
    with_client(opts, path, |bc, p| {
        let mut usage = bc.run(bc.client.target_usage())?;
        let config = bc.client.config();
        let fsname = config.fsname.clone();
        if let Some(name) = &pool {
            // `lfs df --pool`: the MDTs and the pool's OSTs.
            let name = proto::msg::pool_part(name);
            let members = &config.pool(name).with_context(|| format!("pool {fsname}.{name} does not exist"))?.osts;
            usage.retain(|(t, _)| t.kind == TargetKind::Mdt || members.contains(&t.index));
        }
        let mount = p.url();
        let mut out = std::io::stdout().lock();
        let cols =
            if inodes { ("Inodes", "IUsed", "IFree", "IUse%") } else { ("1K-blocks", "Used", "Available", "Use%") };
        writeln!(out, "{:<24} {:>12} {:>12} {:>12} {:>5} Mounted on", "UUID", cols.0, cols.1, cols.2, cols.3)?;
        let fmt = |n: u64| {
            if human_units && !inodes {
                human(n)
            } else {
                n.to_string()
            }
        };
        let (mut sum_total, mut sum_used, mut sum_avail) = (0u64, 0u64, 0u64);
        for (t, u) in &usage {
            let uuid = format!("{fsname}-{}{:04x}_UUID", t.kind.name(), t.index);
            let tag = format!("{mount}[{}:{}]", t.kind.name(), t.index);
            match u {
                Ok(u) => {
                    let (total, used, avail) = if inodes {
                        (u.total_inodes, u.total_inodes - u.free_inodes, u.free_inodes)
                    } else {
                        (u.total_bytes / 1024, (u.total_bytes - u.free_bytes) / 1024, u.avail_bytes / 1024)
                    };
                    let pct = if used + avail == 0 { 0 } else { (used * 100).div_ceil(used + avail) };
                    // An emulated medium is labelled after the mount tag.
                    let media = t.media.as_ref().map_or(String::new(), |m| format!(" [{m}]"));
                    writeln!(
                        out,
                        "{uuid:<24} {:>12} {:>12} {:>12} {:>4}% {tag}{media}",
                        fmt(total),
                        fmt(used),
                        fmt(avail),
                        pct
                    )?;
                    let counts = if inodes { t.kind == TargetKind::Mdt } else { t.kind == TargetKind::Ost };
                    if counts {
                        sum_total += total;
                        sum_used += used;
                        sum_avail += avail;
                    }
                }
                Err(e) => writeln!(out, "{uuid:<24} : {e} {tag}")?,
            }
        }
        let pct = if sum_used + sum_avail == 0 { 0 } else { (sum_used * 100).div_ceil(sum_used + sum_avail) };
        writeln!(out)?;
        writeln!(
            out,
            "{:<24} {:>12} {:>12} {:>12} {:>4}% {mount}",
            "filesystem_summary:",
            fmt(sum_total),
            fmt(sum_used),
            fmt(sum_avail),
            pct
        )?;
        Ok(())
    })
}

/// Paces work to at most `limit` items a second since it started (LFSCK's
/// `--speed`: `braid fsck`, `braid migrate -m`); 0: no limit.
pub(crate) struct Pace {
    limit: u64,
    start: Instant,
    items: u64,
}

impl Pace {
    pub(crate) fn new(limit: u64) -> Pace {
        Pace { limit, start: Instant::now(), items: 0 }
    }

    /// `n` more items were done: waits until they are due.
    pub(crate) async fn took(&mut self, n: usize) {
        self.items += n as u64;
        if self.limit == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.items as f64 / self.limit as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(mode_string(FileKind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(FileKind::File, 0o4644), "-rwSr--r--");
        assert_eq!(format_time(Timespec { sec: 0, nsec: 0 }), "1970-01-01 00:00:00");
        assert_eq!(format_time(Timespec { sec: 1_795_000_000, nsec: 0 }), "2026-11-18 11:06:40");
    }
}
