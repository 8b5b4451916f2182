//! The storage the engines measure, behind one small trait. The IOR, mdtest and IOzone
//! engines only ever call [`FileBackend`]; [`PosixBackend`] runs them on any mounted directory
//! (a braid FUSE mount, a local disk, another file system), and the `braid` binary supplies a
//! [`NativeConnect`] that opens the native braid client for `-a native` on `braid://` targets.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};

use crate::error::{BenchError, Result};

/// How to open a file. Files are created with mode 0644.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// `O_CREAT`.
    pub create: bool,
    /// `O_TRUNC`.
    pub truncate: bool,
    /// `O_EXCL` (with `create`: fail if the file exists, as mdtest creates).
    pub exclusive: bool,
    /// `O_DIRECT`: bypass the client cache. Buffers, offsets and lengths are multiples of
    /// 4096 bytes whenever the engines set this.
    pub direct: bool,
}

impl OpenFlags {
    pub fn read_only() -> OpenFlags {
        OpenFlags { read: true, ..OpenFlags::default() }
    }

    pub fn write_only() -> OpenFlags {
        OpenFlags { write: true, ..OpenFlags::default() }
    }

    pub fn with_direct(mut self, direct: bool) -> OpenFlags {
        self.direct = direct;
        self
    }
}

/// An open file of one backend; meaningful only to the backend that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

/// What mdtest's stat phase and the engines need from `stat(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub size_bytes: u64,
    pub is_dir: bool,
}

/// The operations the engines perform. One backend serves one task process, from one thread.
///
/// Paths are absolute in the backend's namespace: ordinary paths for POSIX, paths inside the
/// braid file system (`/dir/file`) for the native client. Errors are `std::io::Error`; a
/// backend over a remote protocol maps its status codes to errno values
/// (`io::Error::from_raw_os_error`), so messages read the same on every backend.
/// Short reads and writes are allowed (the engines loop); a read at or past the end of the
/// file returns 0.
pub trait FileBackend: Send {
    fn open(&mut self, path: &str, flags: OpenFlags) -> io::Result<FileHandle>;
    fn pwrite(&mut self, file: FileHandle, buf: &[u8], offset: u64) -> io::Result<usize>;
    fn pread(&mut self, file: FileHandle, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Makes the file's data durable (`fsync(2)`).
    fn fsync(&mut self, file: FileHandle) -> io::Result<()>;
    fn close(&mut self, file: FileHandle) -> io::Result<()>;
    fn unlink(&mut self, path: &str) -> io::Result<()>;
    /// Creates one directory (mode 0755); its parent exists.
    fn mkdir(&mut self, path: &str) -> io::Result<()>;
    fn rmdir(&mut self, path: &str) -> io::Result<()>;
    fn stat(&mut self, path: &str) -> io::Result<FileStat>;
    /// Requests sent so far to metadata and to object servers, for a backend that
    /// knows (the native braid client); what an operation costs in round trips.
    fn rpc_tally(&self) -> Option<RpcTally> {
        None
    }
}

/// Requests sent to metadata and to object servers (see [`FileBackend::rpc_tally`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RpcTally {
    pub mds: u64,
    pub ost: u64,
}

impl RpcTally {
    /// What was sent between `self` (before) and `after`.
    pub fn until(self, after: RpcTally) -> RpcTally {
        RpcTally { mds: after.mds.saturating_sub(self.mds), ost: after.ost.saturating_sub(self.ost) }
    }
}

/// Opens the native braid client for a cluster address `braid://HOST:PORT` (no path). The
/// `braid` binary supplies it; tests and other binaries pass `None` and `-a native` is refused.
pub type NativeConnect = fn(&str) -> anyhow::Result<Box<dyn FileBackend>>;

/// `FileBackend` over the POSIX calls of the running kernel.
#[derive(Debug, Default)]
pub struct PosixBackend {
    files: HashMap<u64, File>,
    next_handle: u64,
}

impl PosixBackend {
    pub fn new() -> PosixBackend {
        PosixBackend::default()
    }

    fn file(&self, file: FileHandle) -> io::Result<&File> {
        self.files.get(&file.0).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

impl FileBackend for PosixBackend {
    fn open(&mut self, path: &str, flags: OpenFlags) -> io::Result<FileHandle> {
        let mut options = OpenOptions::new();
        options.read(flags.read).write(flags.write).mode(0o644);
        if flags.create && flags.exclusive {
            options.create_new(true);
        } else {
            options.create(flags.create);
        }
        options.truncate(flags.truncate);
        if flags.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(path)?;
        let handle = self.next_handle;
        self.next_handle += 1;
        self.files.insert(handle, file);
        Ok(FileHandle(handle))
    }

    fn pwrite(&mut self, file: FileHandle, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.file(file)?.write_at(buf, offset)
    }

    fn pread(&mut self, file: FileHandle, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file(file)?.read_at(buf, offset)
    }

    fn fsync(&mut self, file: FileHandle) -> io::Result<()> {
        self.file(file)?.sync_all()
    }

    fn close(&mut self, file: FileHandle) -> io::Result<()> {
        // Dropping a std File ignores close(2)'s result; benchmarks only need it gone.
        self.files.remove(&file.0).map(drop).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn unlink(&mut self, path: &str) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn mkdir(&mut self, path: &str) -> io::Result<()> {
        std::fs::DirBuilder::new().mode(0o755).create(path)
    }

    fn rmdir(&mut self, path: &str) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn stat(&mut self, path: &str) -> io::Result<FileStat> {
        // stat(2) as mdtest calls it; std's metadata() asks statx for every field.
        let c_path = std::ffi::CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: an all-zero `struct stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: c_path is NUL-terminated and st is a valid, writable struct stat.
        if unsafe { libc::stat(c_path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(FileStat { size_bytes: st.st_size as u64, is_dir: st.st_mode & libc::S_IFMT == libc::S_IFDIR })
    }
}

/// The I/O interface, IOR's `-a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// POSIX calls on a mounted directory.
    Posix,
    /// The braid client library on a `braid://HOST:PORT/path` target.
    Native,
}

impl Api {
    pub fn label(self) -> &'static str {
        match self {
            Api::Posix => "POSIX",
            Api::Native => "native",
        }
    }
}

/// Where a benchmark runs: which backend, and the path inside it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    pub api: Api,
    /// `braid://HOST:PORT` for native targets, empty for POSIX.
    pub cluster: String,
    /// The path the engines use (absolute inside the braid file system for native targets).
    pub path: String,
}

impl Target {
    /// Checks that `location` fits `api`: `braid://` URLs go with `native`, paths with `posix`.
    pub fn parse(api: Api, location: &str) -> Result<Target> {
        match (api, location.strip_prefix("braid://")) {
            (Api::Native, Some(rest)) => {
                let (host_port, path) = match rest.find('/') {
                    Some(slash) => (&rest[..slash], &rest[slash..]),
                    None => (rest, "/"),
                };
                if host_port.is_empty() {
                    return Err(BenchError::Usage(format!(
                        "'{location}' has no HOST:PORT (expected braid://HOST:PORT/path)"
                    )));
                }
                Ok(Target { api, cluster: format!("braid://{host_port}"), path: path.to_string() })
            }
            (Api::Native, None) => Err(BenchError::Usage(format!(
                "-a native needs a braid://HOST:PORT/path target, not '{location}' \
                 (use -a posix for a mounted directory)"
            ))),
            (Api::Posix, Some(_)) => Err(BenchError::Usage(format!(
                "'{location}' is a braid:// URL: use -a native, or -a posix on a mount point"
            ))),
            (Api::Posix, None) => Ok(Target { api, cluster: String::new(), path: location.to_string() }),
        }
    }

    /// Opens a backend for this target.
    pub fn connect(&self, native: Option<NativeConnect>) -> Result<Box<dyn FileBackend>> {
        match self.api {
            Api::Posix => Ok(Box::new(PosixBackend::new())),
            Api::Native => {
                let connect = native.ok_or_else(|| {
                    BenchError::Usage(
                        "-a native: this binary was built without the native braid client; \
                         mount braid and use -a posix on the mount point"
                            .into(),
                    )
                })?;
                connect(&self.cluster).map_err(|e| BenchError::Other(format!("connecting to {}: {e:#}", self.cluster)))
            }
        }
    }

    /// How the user wrote the target.
    pub fn display(&self) -> String {
        format!("{}{}", self.cluster, self.path)
    }
}

/// `dir/name`, without doubling a trailing slash.
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The parent directory of `path` (`.` for a bare name).
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(slash) => &path[..slash],
        None => ".",
    }
}

/// Writes all of `buf` at `offset`, looping on short writes.
pub fn write_all_at(
    backend: &mut dyn FileBackend,
    file: FileHandle,
    mut buf: &[u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        let written = backend.pwrite(file, buf, offset)?;
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote 0 bytes"));
        }
        buf = &buf[written..];
        offset += written as u64;
    }
    Ok(())
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub fn read_full_at(backend: &mut dyn FileBackend, file: FileHandle, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let got = backend.pread(file, &mut buf[filled..], offset + filled as u64)?;
        if got == 0 {
            break;
        }
        filled += got;
    }
    Ok(filled)
}

/// A zeroed buffer aligned to 4096 bytes, as `O_DIRECT` requires of user memory.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

const DIRECT_ALIGN: usize = 4096;

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least DIRECT_ALIGN bytes).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(DIRECT_ALIGN), DIRECT_ALIGN)
            .expect("buffer size overflows")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_match_their_api() {
        let posix = Target::parse(Api::Posix, "/mnt/braid/x").unwrap();
        assert_eq!(posix.path, "/mnt/braid/x");
        let native = Target::parse(Api::Native, "braid://mgs:7000/bench/f").unwrap();
        assert_eq!(native.cluster, "braid://mgs:7000");
        assert_eq!(native.path, "/bench/f");
        assert_eq!(native.display(), "braid://mgs:7000/bench/f");
        assert_eq!(Target::parse(Api::Native, "braid://h:1").unwrap().path, "/");
        assert!(Target::parse(Api::Native, "/mnt/x").is_err());
        assert!(Target::parse(Api::Posix, "braid://h:1/x").is_err());
        assert!(Target::parse(Api::Native, "braid:///x").is_err());
        let err = native.connect(None).err().expect("no native client");
        assert!(err.to_string().contains("native"), "{err}");
    }

    #[test]
    fn paths_join_and_split() {
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(join("/a/", "b"), "/a/b");
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/b"), "/");
        assert_eq!(parent("b"), ".");
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [1, 3901, 4096, 1 << 20] {
            let mut buf = AlignedBuf::new(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % DIRECT_ALIGN, 0);
            buf[len - 1] = 7;
            assert!(buf[..len - 1].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn posix_backend_round_trip() {
        let dir = std::env::temp_dir().join(format!("braid-bench-backend-{}", std::process::id()));
        let dir = dir.to_str().unwrap().to_string();
        let mut backend = PosixBackend::new();
        backend.mkdir(&dir).unwrap();
        let path = join(&dir, "f");
        let create = OpenFlags { write: true, create: true, exclusive: true, ..OpenFlags::default() };
        let file = backend.open(&path, create).unwrap();
        write_all_at(&mut backend, file, b"hello", 3).unwrap();
        backend.fsync(file).unwrap();
        backend.close(file).unwrap();
        assert!(backend.close(file).is_err());
        assert!(backend.open(&path, create).is_err(), "O_EXCL on an existing file");
        assert_eq!(backend.stat(&path).unwrap(), FileStat { size_bytes: 8, is_dir: false });
        let file = backend.open(&path, OpenFlags::read_only()).unwrap();
        let mut buf = [9u8; 16];
        assert_eq!(read_full_at(&mut backend, file, &mut buf, 0).unwrap(), 8);
        assert_eq!(&buf[..8], b"\0\0\0hello");
        backend.close(file).unwrap();
        backend.unlink(&path).unwrap();
        assert!(backend.stat(&dir).unwrap().is_dir);
        backend.rmdir(&dir).unwrap();
    }
}
