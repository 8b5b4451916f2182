//! The data path: striped reads and writes, truncates and hole punches of a file,
//! and what they keep in the client: the caches they drop and fill, the in-flight
//! writes of each file's handles, the PFL components a write instantiates.
//!
//! A request is cut by the handle's current layout into extents of at most
//! `max_rpc_bytes` (one RPC each, see [`crate::objio`], which alone knows where they
//! live) and every extent is sent at once; the per-connection in-flight bound of the
//! RPC layer keeps the pressure on each OST bounded. Writes send exactly the caller's
//! bytes (no read-modify-write of pages), so clients writing disjoint ranges of one
//! file never clobber each other. Each request takes the layout once, so a layout
//! replaced meanwhile applies from the next request on.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use layout::Layout;
use proto::msg::DOM_WRITE_MAX;
use proto::{Errno, Fid};
use tokio::task::JoinSet;

use crate::objio::{self, join_all, join_err};
use crate::{cache_key, Client, ClientError, OpenFile, Result};

/// Writes of one handle that are on their way to the OSTs (write-behind).
///
/// A write registers its byte range before its RPCs leave and removes it when they are
/// all answered. A new write or a read waits while an in-flight range overlaps its own,
/// so writes to the same bytes reach the OSTs in order and a handle reads its own
/// writes; a write also waits while the in-flight bytes would exceed the bound.
#[derive(Default)]
pub struct Inflight {
    state: Mutex<InflightState>,
    changed: tokio::sync::Notify,
    /// Bumped by every write and size change of the handle: read-ahead taken at an
    /// older generation is dropped. Here, next to the in-flight writes, so a truncate by
    /// FID reaches every handle of the file through the client's registry.
    pub(crate) data_gen: std::sync::atomic::AtomicU64,
    /// The file's truncate epoch the handle's size is valid under (see
    /// `Attr::trunc_epoch`); here for the same reason as `data_gen`.
    pub(crate) trunc_epoch: std::sync::atomic::AtomicU64,
    /// The handle was opened for writing (what an open replay tells the MDS).
    pub(crate) writable: std::sync::atomic::AtomicBool,
    /// [`write_seq`] when a write through the handle last started or was last
    /// answered: an open's bytes are kept only if no write of the file was on its way
    /// while the open was.
    last_write: std::sync::atomic::AtomicU64,
    /// `data_gen + 1` when this client last set the file's mtime explicitly, after
    /// the handle's writes had landed (0: never). While `data_gen` has not moved
    /// since, the handle's size reports leave the mtime alone (see
    /// `Client::before_times_set`).
    pub(crate) mtime_set_at: std::sync::atomic::AtomicU64,
}

/// A process-wide clock of write starts and completions (see `Inflight::last_write`).
static WRITE_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The write clock now: a write that starts or is answered from here on is later.
pub(crate) fn write_seq() -> u64 {
    WRITE_SEQ.load(std::sync::atomic::Ordering::Acquire)
}

#[derive(Default)]
struct InflightState {
    /// The in-flight writes' ranges, start → end. They never overlap (a write
    /// overlapping one waits), so a lookup is a search, not a scan (with write-behind
    /// thousands of small writes can be in flight), and its start names a write.
    ranges: std::collections::BTreeMap<u64, u64>,
    bytes: u64,
    /// First failure since the last drain, reported once.
    error: Option<(Errno, String)>,
}

impl InflightState {
    /// Whether `[start, end)` overlaps an in-flight range. The ranges are disjoint, so
    /// if any does, the last one starting before `end` does.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.ranges.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }
}

impl Inflight {
    /// Waits until `[start, end)` overlaps no in-flight write (and, for a write of
    /// `reserve` bytes, until it fits under `limit`), then registers it if `reserve > 0`;
    /// returns `start`, which names the write to [`Inflight::finish`].
    async fn admit(&self, start: u64, end: u64, reserve: u64, limit: u64) -> u64 {
        loop {
            let changed = self.changed.notified();
            {
                let mut st = self.state.lock().expect("inflight");
                let overlap = st.overlaps(start, end);
                let fits = st.bytes == 0 || st.bytes + reserve <= limit;
                if !overlap && fits {
                    if reserve == 0 {
                        return 0;
                    }
                    st.ranges.insert(start, end);
                    st.bytes += reserve;
                    return start;
                }
            }
            changed.await;
        }
    }

    fn touch(&self) {
        let now = WRITE_SEQ.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        self.last_write.fetch_max(now, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether a write of the handle was on its way at any time since `since` (a
    /// [`write_seq`] reading) or is now.
    pub(crate) fn wrote_since(&self, since: u64) -> bool {
        self.last_write.load(std::sync::atomic::Ordering::Acquire) > since
            || !self.state.lock().expect("inflight").ranges.is_empty()
    }

    fn finish(&self, start: u64, bytes: u64, result: &Result<()>) {
        self.touch();
        let mut st = self.state.lock().expect("inflight");
        st.ranges.remove(&start);
        st.bytes -= bytes;
        if let (Err(e), None) = (result, &st.error) {
            st.error = Some((e.errno(), e.to_string()));
        }
        drop(st);
        self.changed.notify_waiters();
    }

    fn take_error(&self) -> Result<()> {
        match self.state.lock().expect("inflight").error.take() {
            Some((code, msg)) => Err(ClientError::Errno(code, format!("an earlier write failed: {msg}"))),
            None => Ok(()),
        }
    }

    /// Waits for every in-flight write, leaving any failure to the handle's owner.
    pub async fn settle(&self) {
        self.admit(0, u64::MAX, 0, u64::MAX).await;
    }

    /// Waits for every in-flight write; returns the first failure since the last drain.
    pub async fn drain(&self) -> Result<()> {
        self.admit(0, u64::MAX, 0, u64::MAX).await;
        self.take_error()
    }
}

pub(crate) async fn write(c: &Client, f: &OpenFile, offset: u64, data: Bytes) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let len = data.len() as u64;
    let end = offset.checked_add(len).filter(|&e| e <= i64::MAX as u64).ok_or_else(|| {
        ClientError::Errno(Errno::Inval, format!("write at {offset}+{len} exceeds the largest file size"))
    })?;
    f.inflight.take_error()?;
    f.inflight.touch();
    // What this or another handle of the file read ahead, or the SSD cache holds,
    // may predate this write.
    bump_data_gen(c, f);
    c.cache_invalidate(f.fid, offset, len);
    // A component not instantiated yet gets its objects first (PFL): the MDS
    // instantiates, the handle takes the layout of the new generation.
    let mut layout = c.instantiate(f, end).await?;
    if layout.is_mirrored() {
        // Boxed: kept out of the future of every write of a file without mirrors.
        layout = Box::pin(c.write_mirror(f, layout, offset, end)).await?;
    }
    let extents = objio::extents(f.fid, &layout, offset, len, c.inner.cfg.max_rpc_bytes)?;
    let limit = c.inner.cfg.max_dirty_bytes;
    let behind = limit > 0;
    let id = if behind { f.inflight.admit(offset, end, len, limit).await } else { 0 };
    let mut set = JoinSet::new();
    let mut to_publish = false;
    for extent in extents {
        let payload: Vec<Bytes> = extent.spans.iter().map(|&(b, n)| data.slice(b as usize..(b + n) as usize)).collect();
        let target = match c.object_io(extent.target).await {
            Ok(t) => t,
            Err(e) => {
                if behind {
                    f.inflight.finish(id, len, &Ok(()));
                }
                return Err(e);
            }
        };
        f.dirty.lock().expect("dirty").insert(extent.target);
        // An OST write leaves the size to report at flush; a DoM write publishes it
        // with the bytes (a small file's close then has nothing to report), unless the
        // file's truncate epoch moved.
        let publish = match extent.target {
            objio::Target::Ost { .. } => {
                f.needs_publish.store(true, std::sync::atomic::Ordering::Release);
                to_publish = true;
                None
            }
            objio::Target::Mdt { .. } => Some(f.inflight.trunc_epoch.load(std::sync::atomic::Ordering::Acquire)),
        };
        let needs_publish = f.needs_publish.clone();
        let created = f.create_gate();
        // A new file's first bytes may go with its create, still held back (see
        // `async_create`): one request where two were. Handed over before this write
        // returns, so a flush after it finds them there.
        if let Some(gate) = created.as_ref().filter(|_| {
            matches!(extent.target, objio::Target::Mdt { .. })
                && extent.object_offset == 0
                && extent.len <= DOM_WRITE_MAX
        }) {
            let data = payload.iter().fold(Vec::with_capacity(extent.len as usize), |mut all, b| {
                all.extend_from_slice(b);
                all
            });
            if gate.attach(data).is_ok() {
                // Written, and the size published, by the create.
                let gate = gate.clone();
                set.spawn(rpc::stats::in_current_job(async move { gate.wait().await }));
                continue;
            }
        }
        set.spawn(rpc::stats::in_current_job(async move {
            // A file whose create went out in the background exists once it is answered.
            if let Some(gate) = created {
                gate.wait().await?;
            }
            let published = target.write(extent.object_offset, payload, extent.len, publish).await?;
            if !published {
                needs_publish.store(true, std::sync::atomic::Ordering::Release);
            }
            Ok(())
        }));
    }
    let wait_all = async move { join_all(set).await.map(|_| ()) };
    if behind {
        let inflight = f.inflight.clone();
        tokio::spawn(async move {
            let r = wait_all.await;
            inflight.finish(id, len, &r);
        });
    } else {
        let r = wait_all.await;
        f.inflight.touch();
        r?;
    }
    f.written.store(true, std::sync::atomic::Ordering::Release);
    f.grow(end);
    // Once more, now that the size covers this write and its range is registered (or,
    // without write-behind, written):
    // - a size report (`Client::report_size`) reads the generation before the size; one
    //   that ran since the bump above (a FLUSH of another descriptor of the handle, e.g.
    //   a forked child's exec closing it) may have published the size without this
    //   write, and must not count as covering it. The flag is set again after the size
    //   grew, so the next flush, fsync or close publishes it.
    // - read-ahead issued since the bump above by a concurrent read took the new
    //   generation and may have read this range before the write reached the OSTs.
    if to_publish {
        f.needs_publish.store(true, std::sync::atomic::Ordering::Release);
    }
    bump_data_gen(c, f);
    // - a read that took its SSD cache ticket after the invalidation above but before
    //   this write was registered (or, without write-behind, landed) did not wait for it
    //   and may have read the old bytes: its fill is refused by this second one. A read
    //   ticketed from here on waits for the write first.
    c.cache_invalidate(f.fid, offset, len);
    Ok(())
}

/// Drops what every handle of the file in this client read ahead, and makes the
/// handle's size count as not published (see `Client::report_size`).
fn bump_data_gen(c: &Client, f: &OpenFile) {
    f.inflight.data_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    for other in c.file_inflights(f.fid) {
        if !Arc::ptr_eq(&other, &f.inflight) {
            other.data_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

pub(crate) async fn read(c: &Client, f: &OpenFile, offset: u64, len: u64) -> Result<Bytes> {
    let size = f.size();
    if offset >= size || len == 0 {
        return Ok(Bytes::new());
    }
    let len = len.min(size - offset);
    if let Some(data) = f.data_from_open(offset, len) {
        return Ok(data);
    }
    // Bytes in the memory cache are current: every write of this client dropped what
    // it touches when it was issued, and a read that raced one was refused the fill.
    if let Some(data) =
        c.inner.pages.as_ref().and_then(|p| p.read(crate::cache_key(f.fid), f.data_version, offset, len))
    {
        return Ok(data);
    }
    // The caches' tickets come first: a write issued from here on refuses the fill of
    // what this read gets, and one issued before has landed once the wait below
    // returns.
    let ticket = c.fill_tickets(f.fid, f.data_version);
    // Read the writes of this client (POSIX: a read sees every write that returned
    // before it, through any descriptor): wait for the in-flight writes of this range,
    // of this handle and of the file's other handles here.
    f.inflight.admit(offset, offset + len, 0, u64::MAX).await;
    for other in c.file_inflights(f.fid) {
        if !Arc::ptr_eq(&other, &f.inflight) {
            other.admit(offset, offset + len, 0, u64::MAX).await;
        }
    }
    // A range the handle's layout has no objects for was instantiated by another
    // client, or is a hole: ask for the layout again before reading it as zeros.
    let mut layout = f.layout();
    if !layout.instantiated_below(offset + len) {
        // Boxed: rare, and kept out of every read's future (see `Client::target`).
        if let Some(fresh) = Box::pin(c.getattr(f.fid)).await?.layout {
            f.replace_layout(fresh);
        }
        layout = f.layout();
    }
    // One reader at a time uses the read-ahead state; a concurrent reader of the same
    // handle (FUSE issues reads in parallel) reads directly instead of waiting.
    match f.readahead.try_lock() {
        Ok(mut ra) => ra.read(c, f, &layout, offset, len, size, ticket).await,
        Err(_) => read_through(c, f.fid, f.data_version, &layout, offset, len, ticket).await,
    }
}

/// `[offset, offset+len)` of a file as ranges of local object files in file order,
/// if short-circuit I/O reaches every object of it (else `None`: DoM bytes, an OST
/// served elsewhere, an SSD cache to consult): what a server sends on without reading
/// it (see [`Client::read_for_send`]). Past the file's end, holes and absent objects
/// are ranges of zeros. Waits for this client's writes of the range, as a read does.
pub(crate) async fn local_ranges(
    c: &Client,
    f: &OpenFile,
    offset: u64,
    len: u64,
) -> Result<Option<Vec<crate::LocalRange>>> {
    if c.inner.local_osts.is_none() || c.inner.cache.is_some() || len == 0 {
        return Ok(None);
    }
    let end = offset.saturating_add(len);
    let within = f.size().clamp(offset, end) - offset;
    // As `read`: this client's writes of the range first, and a layout that knows of
    // every component the range reaches.
    f.inflight.admit(offset, end, 0, u64::MAX).await;
    for other in c.file_inflights(f.fid) {
        if !Arc::ptr_eq(&other, &f.inflight) {
            other.admit(offset, end, 0, u64::MAX).await;
        }
    }
    let mut layout = f.layout();
    if within > 0 && !layout.instantiated_below(offset + within) {
        if let Some(fresh) = Box::pin(c.getattr(f.fid)).await?.layout {
            f.replace_layout(fresh);
        }
        layout = f.layout();
    }
    // A mirrored file is read through a mirror that answers (see `mirror`).
    if layout.is_mirrored() {
        return Ok(None);
    }
    let extents = if within > 0 { objio::extents_to_read(f.fid, &layout, offset, within, u64::MAX)? } else { vec![] };
    // (offset in the request, range), then sorted and the gaps filled with zeros.
    let mut pieces: Vec<(u64, crate::LocalRange)> = Vec::new();
    for extent in &extents {
        let target = c.object_io(extent.target).await?;
        let Some(file) = target.local_descriptor(extent.len).await else { return Ok(None) };
        let mut at = extent.object_offset;
        for &(b, n) in &extent.spans {
            pieces.push((b, crate::LocalRange { file: file.clone(), offset: at, len: n }));
            at += n;
        }
    }
    pieces.sort_unstable_by_key(|(b, _)| *b);
    let zeros = |len| crate::LocalRange { file: None, offset: 0, len };
    let mut out = Vec::with_capacity(pieces.len() + 1);
    let mut pos = 0u64;
    for (b, r) in pieces {
        if b > pos {
            out.push(zeros(b - pos));
        }
        pos = b + r.len;
        out.push(r);
    }
    if pos < len {
        out.push(zeros(len - pos));
    }
    Ok(Some(out))
}

/// `[offset, offset+len)` of a file as of data `version`: from the SSD cache if it holds
/// them, otherwise from the OSTs, and then queued for the cache under `ticket` (taken
/// before the read waited for this client's writes of the range), after the caller has
/// them. Reads the cache on the calling thread.
async fn read_through(
    c: &Client,
    fid: Fid,
    version: u64,
    layout: &Layout,
    offset: u64,
    len: u64,
    ticket: FillTickets,
) -> Result<Bytes> {
    if let Some(data) = c.inner.cache.as_ref().and_then(|cache| cache.read(crate::cache_key(fid), version, offset, len))
    {
        return Ok(data);
    }
    read_and_fill(c, fid, layout, offset, len, ticket).await
}

/// `[offset, offset+len)` from the OSTs, queued for the SSD cache under `ticket`.
async fn read_and_fill(
    c: &Client,
    fid: Fid,
    layout: &Layout,
    offset: u64,
    len: u64,
    ticket: FillTickets,
) -> Result<Bytes> {
    let (data, local) = read_extents(c, fid, layout, offset, len).await?;
    c.fill_caches(ticket, offset, &data, local);
    Ok(data)
}

/// Bytes of a handle prefetched ahead of a sequential reader, at most.
pub const READAHEAD_WINDOW_BYTES: u64 = 16 << 20;
/// Size of one prefetch (one or more RPCs, one per stripe it touches).
const READAHEAD_CHUNK_BYTES: u64 = 4 << 20;

pub(crate) type Prefetch = tokio::sync::oneshot::Receiver<Result<Bytes>>;

/// What the read-ahead of a client's handles served: bytes answered from chunks it
/// fetched ahead (hits), and bytes the read found nothing ahead for and read itself
/// (misses), as Lustre's `read_ahead_stats` (counted by the reads that use the
/// read-ahead state; a concurrent reader of a handle reads directly and is in neither).
#[derive(Debug, Default)]
pub struct ReadaheadStats {
    hit_bytes: std::sync::atomic::AtomicU64,
    miss_bytes: std::sync::atomic::AtomicU64,
}

impl ReadaheadStats {
    fn hit(&self, n: u64) {
        self.hit_bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn miss(&self, n: u64) {
        self.miss_bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// (hit bytes, miss bytes) so far.
    pub fn read(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hit_bytes.load(Relaxed), self.miss_bytes.load(Relaxed))
    }
}

/// Sequential read-ahead of one handle (Lustre's client read-ahead, simplified): once
/// two reads follow each other, what follows is requested in chunks in the
/// background, so a reader of small transfers keeps every OST busy. The window starts
/// at twice the read and doubles with each read in sequence, up to
/// `READAHEAD_WINDOW_BYTES`: two random reads that happen to meet cost little.
/// A chunk the SSD cache holds is read from there, on a thread of the blocking pool:
/// the cache's disk reads and checksums of the next chunks overlap the answer of this
/// one (an `O_DIRECT` reader asks for one transfer at a time). Any jump resets it; a
/// write through the handle, or a truncate or hole punch of the file through this
/// client, drops it.
#[derive(Default)]
pub struct Readahead {
    /// Where the next sequential read starts.
    next: u64,
    /// Chunks requested, in file order: (start, length, answer).
    pending: std::collections::VecDeque<(u64, u64, Prefetch)>,
    /// The chunk being consumed.
    ready: Option<(u64, Bytes)>,
    /// End of what has been requested.
    issued_until: u64,
    /// The handle's data generation the prefetched chunks were read at.
    gen: u64,
    /// Reads in sequence so far (0: the last one jumped).
    streak: u32,
}

impl Readahead {
    pub(crate) fn reset(&mut self) {
        self.pending.clear();
        self.ready = None;
        self.issued_until = 0;
        self.next = u64::MAX;
    }

    /// Takes the read of the file's first `len` bytes that its open sent beside itself
    /// (see [`crate::first_bytes`]) as the chunk a reader from the start finds ahead,
    /// read at the handle's data generation `gen`.
    pub(crate) fn seed(&mut self, len: u64, first: Prefetch, gen: u64) {
        self.reset();
        self.next = 0;
        self.gen = gen;
        self.pending.push_back((0, len, first));
        self.issued_until = len;
    }

    #[allow(clippy::too_many_arguments)]
    async fn read(
        &mut self,
        c: &Client,
        f: &OpenFile,
        layout: &Arc<Layout>,
        offset: u64,
        len: u64,
        size: u64,
        ticket: FillTickets,
    ) -> Result<Bytes> {
        let gen = f.inflight.data_gen.load(std::sync::atomic::Ordering::Acquire);
        if gen != self.gen {
            // Written or truncated since the prefetch: drop it.
            self.reset();
            self.gen = gen;
        }
        let sequential = offset == self.next;
        self.streak = if sequential { self.streak.saturating_add(1) } else { 0 };
        if !sequential {
            self.pending.clear();
            self.ready = None;
            self.issued_until = offset;
        }
        let end = offset + len;
        let mut out = BytesMut::new();
        let mut pos = offset;
        while pos < end {
            if let Some((start, data)) = &self.ready {
                let (start, dlen) = (*start, data.len() as u64);
                if pos >= start && pos < start + dlen {
                    let from = (pos - start) as usize;
                    let n = ((start + dlen).min(end) - pos) as usize;
                    c.inner.readahead_stats.hit(n as u64);
                    if pos == offset && n as u64 == len {
                        // All of it in one chunk: the chunk's bytes, not a copy.
                        let whole = data.slice(from..from + n);
                        self.next = end;
                        self.refill(c, f, layout, len, end, size);
                        return Ok(whole);
                    }
                    out.extend_from_slice(&data[from..from + n]);
                    pos += n as u64;
                    continue;
                }
            }
            match self.pending.front() {
                Some(&(start, clen, _)) if pos >= start && pos < start + clen => {
                    let (_, _, rx) = self.pending.pop_front().expect("front exists");
                    match rx.await {
                        Ok(Ok(data)) if data.len() as u64 == clen => self.ready = Some((start, data)),
                        _ => {
                            // A failed or short prefetch: read directly from here on.
                            self.reset();
                            let rest = read_through(c, f.fid, f.data_version, layout, pos, end - pos, ticket).await?;
                            c.inner.readahead_stats.miss(rest.len() as u64);
                            out.extend_from_slice(&rest);
                            pos = end;
                        }
                    }
                }
                Some(&(start, _, _)) if start < pos => {
                    self.pending.pop_front();
                }
                _ => {
                    let rest = read_through(c, f.fid, f.data_version, layout, pos, end - pos, ticket).await?;
                    c.inner.readahead_stats.miss(rest.len() as u64);
                    if pos == offset {
                        // Nothing came from the prefetch: the answer as read.
                        self.issued_until = self.issued_until.max(end);
                        self.next = end;
                        self.refill(c, f, layout, len, end, size);
                        return Ok(rest);
                    }
                    out.extend_from_slice(&rest);
                    pos = end;
                    self.issued_until = self.issued_until.max(end);
                }
            }
        }
        self.next = end;
        self.refill(c, f, layout, len, end, size);
        Ok(out.freeze())
    }

    /// Keeps the window ahead of a sequential reader of `len` bytes a read, now at
    /// `end`, full.
    fn refill(&mut self, c: &Client, f: &OpenFile, layout: &Arc<Layout>, len: u64, end: u64, size: u64) {
        if self.streak == 0 {
            return;
        }
        let window = len.saturating_mul(2 << (self.streak - 1).min(20)).min(READAHEAD_WINDOW_BYTES);
        let mut at = self.issued_until.max(end);
        let limit = size.min(end.saturating_add(window));
        while at < limit {
            let n = READAHEAD_CHUNK_BYTES.min(limit - at);
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (client, fid, version, layout) = (c.clone(), f.fid, f.data_version, layout.clone());
            // Before the wait below, as a read's (see `read`).
            let ticket = c.fill_tickets(fid, version);
            tokio::spawn(rpc::stats::in_current_job(async move {
                // Not before the writes of this range still on their way to the
                // OSTs (write-behind), from any handle of the file here: the chunk
                // carries the data generation of now, so bytes read from under such
                // a write would be served as current after it landed.
                for i in client.file_inflights(fid) {
                    i.admit(at, at + n, 0, u64::MAX).await;
                }
                if let Some(cache) = client.inner.cache.clone() {
                    let key = crate::cache_key(fid);
                    let cached = tokio::task::spawn_blocking(move || cache.read_ahead(key, version, at, n)).await;
                    if let Ok(Some(data)) = cached {
                        let _ = tx.send(Ok(data));
                        return;
                    }
                }
                let _ = tx.send(read_and_fill(&client, fid, &layout, at, n, ticket).await);
            }));
            self.pending.push_back((at, n, rx));
            at += n;
        }
        self.issued_until = at;
    }
}

/// Writes `data` at `offset` of file `fid` into the objects `layout` names, straight
/// through object I/O: no handle, no size report, nothing in flight left behind (the
/// copy `migrate` makes into components the file's layout does not have yet). Every
/// component the range reaches must be instantiated. Returns the targets written.
pub(crate) async fn write_extents(
    c: &Client,
    fid: Fid,
    layout: &Layout,
    offset: u64,
    data: Bytes,
) -> Result<Vec<objio::Target>> {
    let extents = objio::extents(fid, layout, offset, data.len() as u64, c.inner.cfg.max_rpc_bytes)?;
    let mut set = JoinSet::new();
    let mut targets = Vec::with_capacity(extents.len());
    for extent in extents {
        let payload: Vec<Bytes> = extent.spans.iter().map(|&(b, n)| data.slice(b as usize..(b + n) as usize)).collect();
        let target = c.object_io(extent.target).await?;
        targets.push(extent.target);
        set.spawn(rpc::stats::in_current_job(async move {
            target.write(extent.object_offset, payload, extent.len, None).await.map(|_| ())
        }));
    }
    join_all(set).await?;
    Ok(targets)
}

/// Every OST object of file `fid` that `layout` names.
pub(crate) fn layout_objects(fid: Fid, layout: &Layout) -> Vec<(u32, proto::ObjectId)> {
    objio::objects(fid, layout)
        .filter_map(|o| match o.target {
            objio::Target::Ost { ost, object } => Some((ost, object)),
            objio::Target::Mdt { .. } => None,
        })
        .collect()
}

/// Reads `[offset, offset+len)` of a file; holes (bytes past an object's end, and
/// components not instantiated) read as zeros. The flag says every byte came through
/// a local descriptor (short-circuit I/O) or is a hole.
pub(crate) async fn read_extents(
    c: &Client,
    fid: Fid,
    layout: &Layout,
    offset: u64,
    len: u64,
) -> Result<(Bytes, bool)> {
    match layout.is_mirrored() {
        true => Box::pin(c.read_mirrored(fid, layout, offset, len)).await,
        false => read_extents_of(c, fid, layout, offset, len).await,
    }
}

/// [`read_extents`] of a layout without mirrors, or of one mirror of a layout.
pub(crate) async fn read_extents_of(
    c: &Client,
    fid: Fid,
    layout: &Layout,
    offset: u64,
    len: u64,
) -> Result<(Bytes, bool)> {
    let extents = objio::extents_to_read(fid, layout, offset, len, c.inner.cfg.max_rpc_bytes)?;
    if extents.is_empty() {
        return Ok((Bytes::from(vec![0u8; len as usize]), true));
    }
    let mut set = JoinSet::new();
    for (i, extent) in extents.iter().enumerate() {
        let target = c.object_io(extent.target).await?;
        let (at, n) = (extent.object_offset, extent.len);
        set.spawn(rpc::stats::in_current_job(async move { target.read(at, n).await.map(|data| (i, data)) }));
    }
    if extents.len() == 1 && extents[0].spans == [(0, len)] {
        // One object-contiguous extent (a read inside one stripe): hand back the
        // payload as it came off the wire, padded with zeros only if the object was short.
        let (_, (data, local)) = set.join_next().await.expect("one task").map_err(join_err)??;
        if data.len() as u64 == len {
            return Ok((data, local));
        }
        let mut buf = BytesMut::zeroed(len as usize);
        buf[..data.len()].copy_from_slice(&data);
        return Ok((buf.freeze(), local));
    }
    let mut buf = BytesMut::zeroed(len as usize);
    let mut all_local = true;
    // Scattered as each answer arrives (not after the last), to overlap the copies
    // with the network.
    while let Some(r) = set.join_next().await {
        let (i, (data, local)) = r.map_err(join_err)??;
        all_local &= local;
        // Scatter the object bytes back to their places in the caller's range.
        let mut at = 0usize;
        for &(b, n) in &extents[i].spans {
            if at >= data.len() {
                break;
            }
            let take = (n as usize).min(data.len() - at);
            buf[b as usize..b as usize + take].copy_from_slice(&data[at..at + take]);
            at += take;
        }
    }
    Ok((buf.freeze(), all_local))
}

/// Cuts every object of a file to what a file of `size` bytes needs.
pub(crate) async fn punch(c: &Client, fid: Fid, layout: &Layout, size: u64) -> Result<()> {
    let mut set = JoinSet::new();
    for object in objio::objects(fid, layout) {
        let object_size = object.size_for_file_size(size);
        let target = c.object_io(object.target).await?;
        set.spawn(rpc::stats::in_current_job(async move { target.cut(object_size).await }));
    }
    join_all(set).await.map(|_| ())
}

/// The file size implied by the objects' sizes.
pub(crate) async fn glimpse(c: &Client, fid: Fid, layout: &Layout) -> Result<u64> {
    let objects: Vec<objio::FileObject> = objio::objects(fid, layout).collect();
    let mut set = JoinSet::new();
    for (i, object) in objects.iter().enumerate() {
        let target = c.object_io(object.target).await?;
        set.spawn(rpc::stats::in_current_job(async move { target.size().await.map(|size| (i, size)) }));
    }
    let sizes = join_all(set).await?;
    Ok(sizes.into_iter().map(|(i, size)| objects[i].file_size_from(size)).max().unwrap_or(0))
}

/// Deallocates `[offset, offset+len)` of a file where its bytes live, OSTs or the MDT
/// (reads back as zeros).
pub(crate) async fn punch_hole(c: &Client, f: &OpenFile, offset: u64, len: u64) -> Result<()> {
    c.cache_invalidate(f.fid, offset, len);
    // The bytes change: the next flush, fsync or close reports the mtime, which moves the
    // file's data version (other clients' caches drop the range at their next open).
    f.written.store(true, std::sync::atomic::Ordering::Release);
    f.needs_publish.store(true, std::sync::atomic::Ordering::Release);
    f.inflight.data_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    // Nothing to deallocate where no component has objects; every mirror's bytes.
    let layout = f.layout();
    let mut extents = Vec::new();
    for m in layout.mirror_ids() {
        extents.extend(objio::extents_to_read(f.fid, &layout.mirror(m), offset, len, u64::MAX)?);
    }
    let mut set = JoinSet::new();
    for extent in extents {
        let target = c.object_io(extent.target).await?;
        set.spawn(rpc::stats::in_current_job(async move { target.trim(extent.object_offset, extent.len).await }));
    }
    join_all(set).await.map(|_| ())
}

/// The write path's bookkeeping in the client: the caches a write or a read touches, the
/// in-flight writes of a file's handles, and the layout a write needs.
impl Client {
    /// This client changed `[off, off + len)` of `fid`: the SSD and memory caches drop
    /// those bytes.
    pub(crate) fn cache_invalidate(&self, fid: Fid, off: u64, len: u64) {
        if let Some(c) = self.inner.cache.as_ref() {
            c.invalidate(cache_key(fid), off, len);
        }
        if let Some(p) = self.inner.pages.as_ref() {
            p.invalidate(cache_key(fid), off, len);
        }
    }

    /// Claims of a read of `fid` at `version` beginning now to fill the caches with
    /// what it brings back (taken before the read waits for this client's writes).
    pub(crate) fn fill_tickets(&self, fid: Fid, version: u64) -> FillTickets {
        FillTickets {
            ssd: self.inner.cache.as_ref().map(|c| c.ticket(cache_key(fid), version)),
            mem: self.inner.pages.as_ref().map(|p| p.ticket(cache_key(fid), version)),
        }
    }

    /// Hands what a read brought back from `offset` to the caches.
    ///
    /// Bytes read through local descriptors (`local`, short-circuit I/O) are in the
    /// kernel's page cache already and stay out of the memory cache, whose copy would
    /// cost more than a reread from there.
    pub(crate) fn fill_caches(&self, tickets: FillTickets, offset: u64, data: &Bytes, local: bool) {
        if let (Some(cache), Some(t)) = (self.inner.cache.as_ref(), tickets.ssd) {
            cache.fill(t, offset, data.clone());
        }
        if let (Some(pages), Some(t), false) = (self.inner.pages.as_ref(), tickets.mem, local) {
            pages.fill(t, offset, data.clone());
        }
    }

    /// Before a size change or hole punch of `fid`: waits for the in-flight writes of
    /// every handle of the file in this client and drops their read-ahead.
    pub(crate) async fn drain_file(&self, fid: Fid) -> Result<()> {
        for i in self.file_inflights(fid) {
            i.drain().await?;
            i.data_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(())
    }

    /// The in-flight write state of every handle of `fid` open in this client.
    pub(crate) fn file_inflights(&self, fid: Fid) -> Vec<Arc<Inflight>> {
        let m = self.inner.open_files.lock().expect("open files");
        m.get(&fid).map(|l| l.iter().filter_map(|w| w.upgrade()).collect()).unwrap_or_default()
    }

    /// `layout`, of file `fid`, with objects for every byte below `end` (PFL
    /// instantiation): as it is when it has them, else as the MDS makes it.
    pub(crate) async fn layout_below(
        &self,
        creds: &proto::msg::Creds,
        fid: Fid,
        layout: Arc<Layout>,
        end: u64,
    ) -> Result<Arc<Layout>> {
        if layout.instantiated_below(end) {
            return Ok(layout);
        }
        let attr = self.change_layout(creds, fid, layout::LayoutChange::Instantiate { end }).await?;
        let layout = attr.layout.ok_or_else(|| ClientError::Errno(Errno::Io, format!("{fid} lost its layout")))?;
        Ok(Arc::new(layout))
    }

    /// The handle's layout with objects for every byte below `end`: where a write or
    /// truncate reaching a component not instantiated yet has the MDS instantiate it
    /// (or learns that another client did) and the handle takes the new generation.
    pub(crate) async fn instantiate(&self, f: &OpenFile, end: u64) -> Result<Arc<Layout>> {
        let layout = f.layout();
        if layout.instantiated_below(end) {
            return Ok(layout);
        }
        // Boxed: once per component, kept out of every write's future.
        let fresh = Box::pin(self.layout_below(&f.creds, f.fid, layout, end)).await?;
        f.replace_layout((*fresh).clone());
        let layout = f.layout();
        match layout.instantiated_below(end) {
            true => Ok(layout),
            false => Err(ClientError::Errno(
                Errno::Io,
                format!("{}: the MDS answered a layout without objects below {end}", f.fid),
            )),
        }
    }
}

/// A read's claims on the SSD and memory caches (see `Client::fill_tickets`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FillTickets {
    ssd: Option<cache::Ticket>,
    mem: Option<cache::mem::Ticket>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search agrees with a scan of every range, for disjoint ranges placed by a
    /// fixed pseudo-random sequence and queries at and around their edges.
    #[test]
    fn an_overlap_search_finds_what_a_scan_of_every_range_finds() {
        let mut st = InflightState::default();
        let mut all: Vec<(u64, u64)> = Vec::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let start = next() % 100_000;
            let end = start + 1 + next() % 300;
            if all.iter().any(|&(s, e)| s < end && start < e) {
                continue;
            }
            st.ranges.insert(start, end);
            all.push((start, end));
        }
        assert!(all.len() > 100);
        let mut probes: Vec<(u64, u64)> = vec![(0, u64::MAX), (0, 1), (100_400, 100_500)];
        for &(s, e) in &all {
            probes.extend([
                (s, e),
                (s - s.min(5), s),
                (e, e + 5),
                (s + (e - s) / 2, e + 1),
                (s.saturating_sub(1), s + 1),
            ]);
        }
        for (start, end) in probes {
            let scan = all.iter().any(|&(s, e)| s < end && start < e);
            assert_eq!(st.overlaps(start, end), scan, "[{start}, {end})");
        }
    }

    #[tokio::test]
    async fn a_write_waits_for_an_overlapping_one_and_not_for_others() {
        let f = std::sync::Arc::new(Inflight::default());
        let a = f.admit(0, 4096, 4096, 1 << 20).await;
        let b = f.admit(4096, 8192, 4096, 1 << 20).await;
        assert!(f.wrote_since(u64::MAX));
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.admit(4000, 4100, 100, 1 << 20).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        f.finish(a, 4096, &Ok(()));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "still overlaps the second write");
        f.finish(b, 4096, &Ok(()));
        let c = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
        f.finish(c, 100, &Ok(()));
        f.drain().await.unwrap();
        assert!(f.state.lock().unwrap().ranges.is_empty());
    }
}
