//! `braid bench -a native`: the benchmark engines' storage interface over the native
//! client, so IOR/mdtest figures can be taken without FUSE in the way.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use bench::{FileBackend, FileHandle, FileStat, OpenFlags, RpcTally};
use bytes::Bytes;
use client::Fid;
use client::{BlockingClient, ClientError, OpenFile};
use client::{Creds, FileKind};

/// Parent directories resolved so far (mdtest works in a few directories).
const DIR_CACHE_MAX: usize = 4096;

pub struct NativeBackend {
    bc: BlockingClient,
    creds: Creds,
    files: HashMap<u64, OpenFile>,
    next: u64,
    dirs: HashMap<String, Fid>,
}

fn io_err(e: ClientError) -> io::Error {
    io::Error::from_raw_os_error(e.errno().raw())
}

/// Opens the native client for `braid://HOST:PORT` (the secret from
/// `BRAID_SECRET_FILE` or the one a local mount recorded; the recovery timeout from
/// `BRAID_TIMEOUT_S`, 60 s by default).
pub fn connect(url: &str) -> anyhow::Result<Box<dyn FileBackend>> {
    let p = crate::url::require(url)?;
    let file = std::env::var_os("BRAID_SECRET_FILE")
        .map(std::path::PathBuf::from)
        .or_else(|| crate::mount::recorded_secret(&p.mgs));
    let secret = crate::client_secret(&file)?;
    let timeout = std::env::var("BRAID_TIMEOUT_S").ok().and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs);
    let bc = crate::mount::native_client(&p.mgs, secret, timeout)?;
    Ok(Box::new(NativeBackend {
        bc,
        creds: client::process_creds(),
        files: HashMap::new(),
        next: 1,
        dirs: HashMap::new(),
    }))
}

fn split(path: &str) -> io::Result<(&str, &str)> {
    let path = path.trim_end_matches('/');
    match path.rfind('/') {
        Some(i) if i + 1 < path.len() => Ok((if i == 0 { "/" } else { &path[..i] }, &path[i + 1..])),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

impl NativeBackend {
    fn dir(&mut self, path: &str) -> io::Result<Fid> {
        if let Some(f) = self.dirs.get(path) {
            return Ok(*f);
        }
        let a = self.bc.run(self.bc.client.resolve(&self.creds, path, true)).map_err(io_err)?;
        if a.kind != FileKind::Dir {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        if self.dirs.len() >= DIR_CACHE_MAX {
            self.dirs.clear();
        }
        self.dirs.insert(path.to_string(), a.fid);
        Ok(a.fid)
    }

    fn file(&self, h: FileHandle) -> io::Result<&OpenFile> {
        self.files.get(&h.0).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

impl FileBackend for NativeBackend {
    fn open(&mut self, path: &str, flags: OpenFlags) -> io::Result<FileHandle> {
        let (parent, name) = split(path)?;
        let parent = self.dir(parent)?;
        let of = client::OpenFlags { read: flags.read, write: flags.write, truncate: flags.truncate };
        let client = &self.bc.client;
        let f = if flags.create {
            self.bc.run(client.create(&self.creds, parent, name, 0o644, flags.exclusive, of, None)).map_err(io_err)?.0
        } else {
            self.bc.run(client.open_at(&self.creds, parent, name, of)).map_err(io_err)?.0
        };
        let h = self.next;
        self.next += 1;
        self.files.insert(h, f);
        Ok(FileHandle(h))
    }

    fn pwrite(&mut self, file: FileHandle, buf: &[u8], offset: u64) -> io::Result<usize> {
        let f = self.file(file)?;
        self.bc.run(self.bc.client.write(f, offset, Bytes::copy_from_slice(buf))).map_err(io_err)?;
        Ok(buf.len())
    }

    fn pread(&mut self, file: FileHandle, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let f = self.file(file)?;
        let data = self.bc.run(self.bc.client.read(f, offset, buf.len() as u64)).map_err(io_err)?;
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    fn fsync(&mut self, file: FileHandle) -> io::Result<()> {
        let f = self.file(file)?;
        self.bc.run(self.bc.client.fsync(f)).map_err(io_err)
    }

    fn close(&mut self, file: FileHandle) -> io::Result<()> {
        let f = self.files.remove(&file.0).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        self.bc.run(self.bc.client.close(f)).map_err(io_err)
    }

    fn unlink(&mut self, path: &str) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let parent = self.dir(parent)?;
        self.bc.run(self.bc.client.unlink(&self.creds, parent, name)).map_err(io_err)
    }

    fn mkdir(&mut self, path: &str) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let parent = self.dir(parent)?;
        let a = self.bc.run(self.bc.client.mkdir(&self.creds, parent, name, 0o755)).map_err(io_err)?;
        if self.dirs.len() < DIR_CACHE_MAX {
            self.dirs.insert(path.trim_end_matches('/').to_string(), a.fid);
        }
        Ok(())
    }

    fn rmdir(&mut self, path: &str) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let parent = self.dir(parent)?;
        self.dirs.remove(path.trim_end_matches('/'));
        self.bc.run(self.bc.client.rmdir(&self.creds, parent, name)).map_err(io_err)
    }

    fn stat(&mut self, path: &str) -> io::Result<FileStat> {
        if path.trim_end_matches('/').is_empty() {
            // The root has no parent to look it up in.
            self.dir("/")?;
            return Ok(FileStat { size_bytes: 0, is_dir: true });
        }
        let (parent, name) = split(path)?;
        let parent = self.dir(parent)?;
        let a = self.bc.run(self.bc.client.lookup(&self.creds, parent, name)).map_err(io_err)?;
        Ok(FileStat { size_bytes: a.size, is_dir: a.kind == FileKind::Dir })
    }

    fn rpc_tally(&self) -> Option<RpcTally> {
        let c = self.bc.client.rpc_counts();
        Some(RpcTally { mds: c.mds, ost: c.ost })
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn splits_paths() {
        assert_eq!(split("/a/b").unwrap(), ("/a", "b"));
        assert_eq!(split("/a").unwrap(), ("/", "a"));
        assert!(split("/").is_err());
    }
}
