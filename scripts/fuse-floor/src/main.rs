//! `fuse-floor MNT FILE MODE`: mounts at MNT a file system of one file, `MNT/f`, whose
//! reads are those of FILE. MODE `direct`: each read is a `pread` of FILE opened
//! `O_DIRECT` by this process (what a FUSE round trip costs over the disk read);
//! `pt`: opens pass through to FILE (FUSE passthrough; the kernel reads it itself).
//!
//! Why: it measures what no FUSE file system can beat, against which braid's mount
//! and its passthrough to the SSD cache are judged (docs/benchmarks.md, issue 15).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackingId, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};

const TTL: Duration = Duration::from_secs(60);
const PAGE: usize = 4096;

struct Floor {
    path: String,
    passthrough: bool,
    size: u64,
    file: File,
    backing: Mutex<Option<Arc<BackingId>>>,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size / 512,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir { FileType::Directory } else { FileType::RegularFile },
        perm: if dir { 0o755 } else { 0o444 },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PAGE as u32,
        flags: 0,
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.passthrough {
            config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .map_err(|_| std::io::Error::other("no passthrough"))?;
            let _ = config.set_max_stack_depth(1);
        }
        let _ = config.set_max_readahead(4 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == "f" {
            reply.entry(&TTL, &attr(2, self.size, false), Generation(0))
        } else {
            reply.error(Errno::ENOENT)
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 => reply.attr(&TTL, &attr(1, 0, true)),
            2 => reply.attr(&TTL, &attr(2, self.size, false)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if !self.passthrough {
            return reply.opened(FileHandle(1), FopenFlags::FOPEN_KEEP_CACHE);
        }
        let mut held = self.backing.lock().expect("backing");
        if held.is_none() {
            match File::open(&self.path).and_then(|f| reply.open_backing(f)) {
                Ok(id) => *held = Some(Arc::new(id)),
                Err(_) => return reply.error(Errno::EIO),
            }
        }
        let id = held.clone().expect("set above");
        reply.opened_passthrough(FileHandle(1), FopenFlags::empty(), &id);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // An O_DIRECT read needs a page-aligned buffer.
        let len = (size as usize).div_ceil(PAGE) * PAGE;
        let mut raw = vec![0u8; len + PAGE];
        let at = raw.as_ptr().align_offset(PAGE);
        let buf = &mut raw[at..at + len];
        match self.file.read_at(buf, offset) {
            Ok(n) => reply.data(&buf[..n.min(size as usize)]),
            Err(_) => reply.error(Errno::EIO),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 || !["direct", "pt"].contains(&args[3].as_str()) {
        eprintln!("usage: fuse-floor MNT FILE direct|pt");
        std::process::exit(2);
    }
    let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&args[2]).expect("open FILE");
    let size = file.metadata().expect("stat FILE").len();
    let fs = Floor { path: args[2].clone(), passthrough: args[3] == "pt", size, file, backing: Mutex::new(None) };
    let mut cfg = Config::default();
    cfg.mount_options = vec![MountOption::FSName("fuse-floor".into()), MountOption::RO];
    fuser::mount(fs, &args[1], &cfg).expect("mount");
}
