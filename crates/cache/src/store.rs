//! Cache files: one sparse file per cached file, in `files/` of the cache directory,
//! holding each cached byte at the offset it has in the braid file.
//!
//! Why one file per file, at the file's own offsets: a braid file the cache holds whole
//! can then be handed to the kernel as the backing file of a FUSE passthrough open, and
//! its reads never reach the mount (see `fuse`'s open). Space is the local file
//! system's to place (ext4 allocates extents with its own buddy allocator, mballoc);
//! the cache counts what it holds against its size and punches dropped bytes out.
//!
//! A file is named by its key and a generation: a cached file dropped while a reader
//! holds its cache file open is unlinked, the reader keeps the bytes it had, and fills
//! of the file's next version go to a new generation.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file, as the cache's user names it (a FID packed into 128 bits).
pub type Key = u128;

/// Cache files kept open, at most (past it the oldest are closed).
const FDS_MAX: usize = 256;

/// An open cache file: buffered, and `O_DIRECT` where the file system allows.
pub struct Fds {
    pub plain: File,
    pub direct: Option<File>,
}

pub struct Store {
    dir: PathBuf,
    fds: HashMap<(Key, u64), Arc<Fds>>,
}

impl Store {
    /// The store in `cache_dir/files`, created if need be. A data file of the layout
    /// before (one file for every cached file) is removed.
    pub fn open(cache_dir: &Path) -> std::io::Result<Store> {
        let dir = cache_dir.join("files");
        std::fs::create_dir_all(&dir)?;
        match std::fs::remove_file(cache_dir.join("data")) {
            Ok(()) => tracing::info!(dir = %cache_dir.display(), "SSD cache: removed the data file of an older layout"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Store { dir, fds: HashMap::new() })
    }

    pub fn path(&self, key: Key, gen: u64) -> PathBuf {
        self.dir.join(format!("{key:032x}.{gen}"))
    }

    /// The cache file of `key` at `gen`, opened (and created, if `create`) if need be.
    pub fn fds(&mut self, key: Key, gen: u64, create: bool) -> Option<Arc<Fds>> {
        if let Some(f) = self.fds.get(&(key, gen)) {
            return Some(f.clone());
        }
        let path = self.path(key, gen);
        let plain = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&path).ok()?;
        let direct = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&path).ok();
        if self.fds.len() >= FDS_MAX {
            self.fds.clear();
        }
        let f = Arc::new(Fds { plain, direct });
        self.fds.insert((key, gen), f.clone());
        Some(f)
    }

    /// Removes the cache file of `key` at `gen` (open descriptors keep its bytes).
    pub fn unlink(&mut self, key: Key, gen: u64) {
        self.fds.remove(&(key, gen));
        let path = self.path(key, gen);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), "SSD cache: removing a cache file failed: {e}"),
        }
    }

    /// Removes every cache file but those of `keep`; returns how many went.
    pub fn remove_others(&mut self, keep: &[(Key, u64)]) -> u64 {
        let keep: std::collections::HashSet<String> = keep.iter().map(|&(k, g)| format!("{k:032x}.{g}")).collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut n = 0;
        for e in entries.flatten() {
            if !keep.contains(e.file_name().to_string_lossy().as_ref()) && std::fs::remove_file(e.path()).is_ok() {
                n += 1;
            }
        }
        n
    }
}

/// A cache file's inode and change time (seconds, nanoseconds).
pub type Stamp = (u64, i64, i64);

/// A file's inode and change time: what a change behind the cache's back moves.
pub fn stamp_of(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// As [`stamp_of`], for an open file.
pub fn stamp_of_file(f: &File) -> Option<Stamp> {
    f.metadata().ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Punches `[off, off + len)` out of `f`, keeping its size.
pub fn punch(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on a descriptor `f` owns; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
