//! Short-circuit local I/O: what an OSS and a client on the same machine share so the
//! client reads and writes the OSS's object files itself, as HDFS clients do on a
//! DataNode's machine ("short-circuit local reads").
//!
//! Why: a client on the OSS's own machine (an NBD export or a mount on a storage
//! node, the all-in-one cluster of `braid local`) would otherwise move every byte
//! through a loopback socket to another process, which copies it again, checksums it
//! on both sides and wakes a thread per request. On this project's 2-core test
//! machine that made an NBD export of a 4-stripe file copy out at half the speed of
//! nbdkit serving one local file, and take 0.8 of its 4 KiB random writes; with the
//! object files' descriptors in hand the export does what nbdkit does, a `pread` or
//! `pwrite` per request (docs/benchmarks.md, issue 17).
//!
//! The channel is a Unix stream socket per OST in the abstract namespace, named after
//! the OST's uuid ([`socket_name`]): only processes of the same network namespace
//! (the machine, or one container) reach it, it leaves no file behind, and a client
//! finds it from the cluster configuration alone. A connection starts with the usual
//! handshake (the cluster secret, proved both ways, so a process squatting the name
//! is refused); then the client asks for objects (`Request::OstOpen`), and each
//! answer carries the object's descriptor as `SCM_RIGHTS` ancillary data on its first
//! byte ([`send_with_fd`], read back by [`FdReader`]). The OSS tells every connection
//! of each object it destroys (`Callback::ObjectDestroyed`), so no client keeps
//! writing into an unlinked file, and a client drops all its descriptors when the
//! connection ends (a stopped OSS: its stripes then fail as they do over TCP).
//! Descriptors pass between processes whatever their mount namespaces, so the OST's
//! path does not matter to the client.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};

/// The abstract socket name of the OST with `uuid`.
pub fn socket_name(uuid: &str) -> String {
    format!("braid-ost-{uuid}")
}

fn abstract_addr(name: &str) -> io::Result<std::os::unix::net::SocketAddr> {
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// Listens on the abstract socket `name`; `AddrInUse` if another process does.
pub fn listen(name: &str) -> io::Result<UnixListener> {
    let l = std::os::unix::net::UnixListener::bind_addr(&abstract_addr(name)?)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// Connects to the abstract socket `name`; `ConnectionRefused` when nobody on this
/// machine listens there (the OST is served elsewhere, or not at all).
pub fn connect(name: &str) -> io::Result<UnixStream> {
    // A Unix socket's connect does not wait for the peer to accept.
    let s = std::os::unix::net::UnixStream::connect_addr(&abstract_addr(name)?)?;
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

/// Writes `frame` whole, with `fd` (if any) passed on its first byte.
pub async fn send_with_fd(w: &mut OwnedWriteHalf, frame: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut rest = frame;
    if let Some(fd) = fd {
        let sock = w.as_ref();
        let sent = loop {
            sock.writable().await?;
            match sock.try_io(Interest::WRITABLE, || sendmsg_with_fd(sock.as_raw_fd(), frame, fd)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        // The descriptor went with the first byte; the rest is plain bytes.
        rest = &frame[sent..];
    }
    w.write_all(rest).await
}

/// One `sendmsg` of (a prefix of) `data` with `fd` attached.
fn sendmsg_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<usize> {
    if data.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a descriptor needs a byte to go with"));
    }
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // Room for one descriptor's control message, aligned as a cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, large enough for one header and one
    // descriptor (asserted above); the header and its data are written within it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null());
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: a valid message whose buffers outlive the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Most descriptors received and not yet taken; a peer sending more is cut off.
pub const FDS_QUEUED_MAX: usize = 64;

/// The reading half of a local connection, keeping the descriptors that arrive with
/// the bytes, in order ([`FdReader::take_fd`]). Frames read through it as through any
/// stream (`proto::frame::read_frame`).
pub struct FdReader {
    half: OwnedReadHalf,
    fds: VecDeque<OwnedFd>,
}

impl FdReader {
    pub fn new(half: OwnedReadHalf) -> FdReader {
        FdReader { half, fds: VecDeque::new() }
    }

    /// The oldest descriptor received and not taken yet. One sent with a frame has
    /// arrived once the frame's first byte has been read.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

impl AsyncRead for FdReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            ready!(this.half.as_ref().poll_read_ready(cx))?;
            let sock = this.half.as_ref();
            let dst = buf.initialize_unfilled();
            let fds = &mut this.fds;
            match sock.try_io(Interest::READABLE, || recvmsg_with_fds(sock.as_raw_fd(), dst, fds)) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One `recvmsg` into `buf`, descriptors that came with the bytes appended to `fds`.
fn recvmsg_with_fds(sock: RawFd, buf: &mut [u8], fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for a few descriptors (a stream socket's read stops at a message carrying
    // some, so one message's worth at a time); aligned as a cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: a valid message whose buffers outlive the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // the length it reported; each descriptor is new to this process and owned here.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push_back(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "more descriptors came than a message may carry"));
    }
    if fds.len() > FDS_QUEUED_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the peer sent descriptors nobody asked for"));
    }
    Ok(n as usize)
}

/// Up to `len` bytes of `file` at `offset` (fewer at its end), read into memory that
/// is not zeroed first: an object read, by the OSS or by a short-circuit client.
pub fn read_at_most(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    let mut got = 0usize;
    while got < len {
        let spare = buf.spare_capacity_mut();
        debug_assert!(spare.len() >= len);
        // SAFETY: pread writes at most `len - got` bytes, inside the spare capacity (at
        // least `len`); `set_len` below covers only bytes it reported written.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().add(got).cast(),
                len - got,
                (offset + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    // SAFETY: the first `got` bytes were written by pread above.
    unsafe { buf.set_len(got) };
    Ok(buf.freeze())
}

/// `len` bytes of `file` at `offset` if the page cache holds them all now, read
/// without waiting for the disk (`preadv2` with `RWF_NOWAIT`); `None` if any would
/// have to come from the disk, lie past the file's end, or the file system cannot
/// tell (the caller then reads with [`read_at_most`], on a thread that may wait).
pub fn read_cached(file: &File, offset: u64, len: usize) -> io::Result<Option<Bytes>> {
    let mut buf = BytesMut::with_capacity(len);
    let spare = buf.spare_capacity_mut();
    let iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: len };
    // SAFETY: one iovec of `len` bytes of the buffer's spare capacity (at least `len`);
    // `set_len` below covers only what preadv2 reported read.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    if n as usize != len {
        return Ok(None);
    }
    // SAFETY: preadv2 wrote `len` bytes.
    unsafe { buf.set_len(len) };
    Ok(Some(buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use tokio::io::AsyncReadExt;

    fn unique(tag: &str) -> String {
        format!("braid-test-{tag}-{}-{:?}", std::process::id(), std::thread::current().id())
    }

    /// Descriptors sent with frames among frames without arrive with their own
    /// frames, in order, and are the files sent (not copies of their bytes).
    #[tokio::test]
    async fn descriptors_arrive_with_their_frames_in_order() {
        let name = unique("fdpass");
        let listener = listen(&name).unwrap();
        assert_eq!(listen(&name).unwrap_err().kind(), io::ErrorKind::AddrInUse, "one listener per name");
        let client = connect(&name).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_srd, mut swr) = server.into_split();
        let (crd, _cwr) = client.into_split();
        let mut reader = FdReader::new(crd);
        let dir = std::env::temp_dir().join(unique("fdpass-files"));
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<File> = (0..20)
            .map(|i| {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(dir.join(i.to_string()))
                    .unwrap();
                write!(f, "file {i}").unwrap();
                f
            })
            .collect();
        let sender = tokio::spawn(async move {
            for (i, f) in files.iter().enumerate() {
                // Frames of every length, every other one with a descriptor.
                let frame = vec![i as u8; 1 + i * 997];
                send_with_fd(&mut swr, &frame, (i % 2 == 0).then(|| f.as_raw_fd())).await.unwrap();
            }
        });
        for i in 0..20usize {
            let mut frame = vec![0u8; 1 + i * 997];
            reader.read_exact(&mut frame).await.unwrap();
            assert!(frame.iter().all(|&b| b == i as u8), "frame {i} is whole");
            if i % 2 == 0 {
                let mut f = File::from(reader.take_fd().expect("the frame's descriptor"));
                let mut text = String::new();
                f.rewind().unwrap();
                f.read_to_string(&mut text).unwrap();
                assert_eq!(text, format!("file {i}"));
            }
            assert!(reader.take_fd().is_none(), "no descriptor ahead of its frame");
        }
        sender.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nobody_listening_is_refused() {
        assert_eq!(connect(&unique("nobody")).unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn a_read_stops_at_the_end_of_the_file() {
        let path = std::env::temp_dir().join(unique("read-at-most"));
        std::fs::write(&path, b"0123456789").unwrap();
        let f = File::open(&path).unwrap();
        assert_eq!(&read_at_most(&f, 2, 4).unwrap()[..], b"2345");
        assert_eq!(&read_at_most(&f, 8, 100).unwrap()[..], b"89");
        assert!(read_at_most(&f, 50, 10).unwrap().is_empty());
        // Just written, so in the page cache; past the end, not whole.
        assert_eq!(&read_cached(&f, 2, 4).unwrap().expect("cached")[..], b"2345");
        assert!(read_cached(&f, 8, 4).unwrap().is_none());
        std::fs::remove_file(&path).unwrap();
    }
}
