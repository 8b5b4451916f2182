//! The commands that ask a running mount process: `braid cache status|drop` (its SSD
//! read cache) and `braid trace on|off|status` (its I/O tracer). They go through
//! virtual extended attributes of the mount's root (as CephFS's `ceph.*` and Lustre's
//! `lustre.*` attributes), so the numbers are live and no other channel to the mount is
//! needed.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The braid mount whose root is `path` or holds it.
fn mount_root(path: &Path) -> Result<PathBuf> {
    let abs = std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))?;
    crate::mount::braid_mounts()
        .into_iter()
        .filter(|m| abs.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len())
        .map(|m| m.mountpoint)
        .with_context(|| format!("{} is not in a braid mount", path.display()))
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).context("a path with a NUL byte")
}

/// The value of the mount process's virtual attribute `name` on its root.
fn get_root_xattr(root: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let path = c_path(root).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let name = CString::new(name).expect("no NUL");
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Sets the mount process's virtual attribute `name` on its root.
fn set_root_xattr(root: &Path, name: &str, value: &[u8]) -> Result<()> {
    let p = c_path(root)?;
    let name = CString::new(name).expect("no NUL");
    // SAFETY: NUL-terminated strings and a value of the length given.
    let r = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA) => bail!("the mount on {} does not offer this", root.display()),
            Some(libc::EPERM) => bail!("only root may do this on {}", root.display()),
            _ => return Err(e.into()),
        }
    }
    Ok(())
}

/// The cache's numbers as the mount reports them (JSON).
fn read_status(root: &Path) -> Result<serde_json::Value> {
    let buf = match get_root_xattr(root, fuse::CACHE_STATUS_XATTR) {
        Ok(b) => b,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
            bail!("the mount on {} has no SSD cache (mount with -o cache_dir=PATH,cache_size=SIZE)", root.display())
        }
        Err(e) => bail!("asking the mount on {} for its cache: {e}", root.display()),
    };
    serde_json::from_slice(&buf).context("the mount's answer is not JSON")
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// `braid cache status`: one line per number, `--json` for the raw answer.
pub fn cache_status(path: &Path, json: bool) -> Result<()> {
    let root = mount_root(path)?;
    let s = read_status(&root)?;
    if json {
        println!("{s}");
        return Ok(());
    }
    let n = |k: &str| s.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (hits, misses) = (n("hits"), n("misses"));
    let rate = if hits + misses == 0 { 0.0 } else { 100.0 * hits as f64 / (hits + misses) as f64 };
    println!("mount:          {}", root.display());
    println!("cache_dir:      {}", s.get("dir").and_then(|v| v.as_str()).unwrap_or("?"));
    println!("size:           {}", human(n("size")));
    println!("used:           {} ({:.1}%)", human(n("used")), 100.0 * n("used") as f64 / n("size").max(1) as f64);
    println!("extents:        {}", n("extents"));
    println!("hit_rate:       {rate:.2}% ({hits} hits, {misses} misses)");
    println!("served:         {}", human(n("hit_bytes")));
    println!("fills:          {} ({})", n("fills"), human(n("fill_bytes")));
    println!("fills_skipped:  {}", n("fills_skipped"));
    println!("fill_errors:    {}", n("fill_errors"));
    println!("evictions:      {}", n("evictions"));
    println!("invalidations:  {}", n("invalidations"));
    println!("damaged:        {}", n("damaged"));
    println!("passthrough:    {} opens (their reads are not counted above)", n("backings"));
    Ok(())
}

/// `braid cache drop`: empties the mount's cache (root only).
pub fn cache_drop(path: &Path) -> Result<()> {
    let root = mount_root(path)?;
    set_root_xattr(&root, fuse::CACHE_DROP_XATTR, b"1").map_err(|e| {
        if e.to_string().contains("does not offer") {
            anyhow::anyhow!("the mount on {} has no SSD cache", root.display())
        } else {
            e.context(format!("dropping the cache of {}", root.display()))
        }
    })?;
    println!("dropped the SSD cache of {}", root.display());
    Ok(())
}

/// `braid trace on|off MOUNTPOINT` (root).
pub fn trace_switch(mountpoint: &Path, on: bool) -> Result<()> {
    let root = mount_root(mountpoint)?;
    set_root_xattr(&root, fuse::TRACE_XATTR, if on { b"on" } else { b"off" })
        .with_context(|| format!("turning tracing {} on {}", if on { "on" } else { "off" }, root.display()))?;
    println!("tracing {} on {}", if on { "on" } else { "off" }, root.display());
    Ok(())
}

/// `braid trace status MOUNTPOINT`.
pub fn trace_status(mountpoint: &Path, json: bool) -> Result<()> {
    let root = mount_root(mountpoint)?;
    let raw = match get_root_xattr(&root, fuse::TRACE_STATUS_XATTR) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
            bail!("the mount on {} has no trace ring (see its log for why)", root.display())
        }
        Err(e) => bail!("asking the mount on {} for its tracer: {e}", root.display()),
    };
    let v: serde_json::Value = serde_json::from_slice(&raw).context("the mount's answer is not JSON")?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    println!("mount:          {}", root.display());
    println!("tracing:        {}", if v["enabled"].as_bool() == Some(true) { "on" } else { "off" });
    println!("ring:           {} ({} records)", v["ring"].as_str().unwrap_or("?"), n("capacity"));
    println!("written:        {}", n("written"));
    println!("collected:      {}", n("collected"));
    println!("dropped:        {}", n("dropped"));
    match v["collector_pid"].as_u64() {
        Some(pid) => println!("collector:      pid {pid}"),
        None => println!("collector:      not running"),
    }
    let dest = &v["destination"];
    match (dest["dir"].as_str(), dest["server"].as_str()) {
        (Some(d), _) => println!("destination:    {d}"),
        (_, Some(s)) => println!("destination:    server {s}"),
        _ => {}
    }
    Ok(())
}
