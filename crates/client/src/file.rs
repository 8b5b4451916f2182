//! The file operations of [`Client`] on an open file: reads, writes, hole punches,
//! flushes and fsync (the size published to the MDT), and closes, sent at once or
//! deferred and batched; byte-range locks and size glimpses. The striped data path
//! itself is [`crate::io`]'s.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use proto::msg::{Request, Response};

use crate::*;

impl Client {
    /// Reads up to `len` bytes at `offset`, clamped to the size the handle knows.
    pub async fn read(&self, f: &OpenFile, offset: u64, len: u64) -> Result<Bytes> {
        let target = || Some(tracer::data_target(f, offset));
        let read = async {
            f.created().await?;
            io::read(self, f, offset, len).await
        };
        self.observe_at("read", Some(f.fid), offset, len, target, read).await
    }

    /// Reads `len` bytes at `offset` for a server that sends them on (the NBD
    /// export): as ranges of local object files when short-circuit I/O reaches all of
    /// them, to be sent from the kernel's page cache without passing through this
    /// process (`sendfile`), each `len` bytes long, zeros past the file's end;
    /// otherwise as [`Client::read`] reads them.
    pub async fn read_for_send(&self, f: &OpenFile, offset: u64, len: u64) -> Result<ReadOut> {
        let target = || Some(tracer::data_target(f, offset));
        let read = async {
            f.created().await?;
            match io::local_ranges(self, f, offset, len).await? {
                Some(ranges) => Ok(ReadOut::Local(ranges)),
                None => io::read(self, f, offset, len).await.map(ReadOut::Bytes),
            }
        };
        self.observe_at("read", Some(f.fid), offset, len, target, read).await
    }

    /// Writes `data` at `offset`, all stripes in parallel. The call returns once the
    /// RPCs are under way (at most `max_dirty_bytes` per file in flight); a failure is
    /// reported by the next write, `flush`, `fsync` or `close` of the handle.
    pub async fn write(&self, f: &OpenFile, offset: u64, data: Bytes) -> Result<u64> {
        let len = data.len() as u64;
        let target = || Some(tracer::data_target(f, offset));
        self.observe_at("write", Some(f.fid), offset, len, target, async {
            io::write(self, f, offset, data).await?;
            Ok(len)
        })
        .await
    }

    /// Deallocates a byte range of an open file; it reads back as zeros and the file
    /// size does not change (`fallocate(PUNCH_HOLE|KEEP_SIZE)`).
    pub async fn punch_hole(&self, f: &OpenFile, offset: u64, len: u64) -> Result<()> {
        self.give_up_behind(f.fid);
        self.observe("punch", Some(f.fid), offset, len, async {
            f.created().await?;
            self.drain_file(f.fid).await?;
            self.refresh_unsettled_layout(f).await?;
            let r = io::punch_hole(self, f, offset, len).await;
            // Again once it landed (see `cut_objects`).
            self.cache_invalidate(f.fid, offset, len);
            r
        })
        .await
    }

    /// The close-to-open point (`close(2)` of a descriptor): waits until every write of
    /// the handle reached its OSTs and publishes the size and mtime on the MDS, so a
    /// client that opens the file afterwards reads it whole. Returns the first error of
    /// a write that failed since the last flush. Unlike `fsync`, nothing is forced to disk.
    pub async fn flush(&self, f: &OpenFile) -> Result<()> {
        self.observe("flush", Some(f.fid), 0, 0, async {
            f.created().await?;
            // The attribute changes answered here go with the size report, when there
            // is one (one request where two were); otherwise first, alone. A file
            // with a DoM component sends them alone: its writes set the mtime as they
            // land, and must land before the times set after them.
            let along = match self.report_due(f) && f.layout().dom_end().is_none() {
                true => self.take_behind(f).await,
                false => None,
            };
            if along.is_none() {
                self.send_behind_of(f).await?;
            }
            // Both at once: the size covers every write already issued, and close(2)
            // returns only when the data and the size are both where they belong. If
            // a write failed, flush reports it (the size may then cover bytes that
            // read back as zeros, which POSIX allows after a failed write).
            let (drained, published) = tokio::join!(f.inflight.drain(), self.report_size_with(f, along));
            drained?;
            published?;
            // A DoM write that could not publish the size with its bytes (the file was
            // truncated from elsewhere meanwhile) says so only when it is answered.
            self.report_size(f).await
        })
        .await
    }

    /// Defers the flush of a handle's close, if it may be (see [`deferred`]): a small
    /// file this client created, in a directory whose lease it still trusts, with no
    /// rename or link since. The flush is then [`Client::finish_deferred`]'s, given the
    /// ticket; without one, flush now.
    pub fn defer_flush(&self, f: &OpenFile) -> Option<deferred::Ticket> {
        let (dir, moves) = f.created_in?;
        if self.inner.moves.load(Ordering::Acquire) != moves {
            return None;
        }
        // Counted before the lease is checked: a revocation after the check waits for it.
        let ticket = self.inner.deferred.begin_on(f.size(), [Some(f.fid), Some(dir)])?;
        self.inner.leases.trusted(dir).then_some(ticket)
    }

    /// Carries out a flush deferred by [`Client::defer_flush`] (from a task of its own).
    pub async fn finish_deferred(&self, f: &OpenFile, ticket: deferred::Ticket) {
        if let Err(e) = deferred::exempt(self.flush(f)).await {
            self.inner.deferred.failed(f.fid, e.to_string());
        }
        drop(ticket);
    }

    /// Sends the attribute changes of the file `f` created that were answered here
    /// (see [`set_behind`]).
    async fn send_behind_of(&self, f: &OpenFile) -> Result<()> {
        match &f.behind {
            Some(b) => self.send_behind(f.fid, b).await,
            None => Ok(()),
        }
    }

    /// Waits until no flush or removal is deferred (an unmount).
    pub async fn deferred_idle(&self) {
        self.inner.deferred.idle().await;
        self.inner.removals.idle().await
    }

    /// Makes the handle's writes durable on the OSTs and its size on the MDT.
    pub async fn fsync(&self, f: &OpenFile) -> Result<()> {
        self.observe("fsync", Some(f.fid), 0, 0, async {
            f.created().await?;
            self.send_behind_of(f).await?;
            if let Some(why) = self.inner.deferred.take_failure(f.fid) {
                return Err(ClientError::Errno(Errno::Io, format!("an earlier close's flush failed: {why}")));
            }
            f.inflight.drain().await?;
            let dirty: Vec<objio::Target> = f.dirty.lock().expect("dirty").drain().collect();
            if let Err(e) = objio::sync(self, &dirty).await {
                // Not synced: a later fsync must try these objects again.
                f.dirty.lock().expect("dirty").extend(dirty);
                return Err(e);
            }
            self.report_size(f).await?;
            self.sync_metadata(f.fid).await
        })
        .await
    }

    /// Makes every metadata operation the MDT holding `fid` has acknowledged durable
    /// (fsync of a file or a directory): MDTs acknowledge once an operation survives
    /// their own crash, and reach the disk at their next checkpoint or at this call.
    pub async fn sync_metadata(&self, fid: Fid) -> Result<()> {
        md_op!(self, "sync_metadata", fid, Request::MdsSync { fid }, Response::Ok => ())?;
        // A removal in this directory answered here and refused later (see
        // `Client::unlink_vetted`) is reported by its next fsync.
        match self.inner.removals.take_failure(fid) {
            Some(why) => Err(ClientError::Errno(Errno::Io, format!("an earlier unlink in {fid} failed: {why}"))),
            None => Ok(()),
        }
    }

    /// Tells the MDS the size and mtime of a written handle, unless nothing was written
    /// since the last time.
    async fn report_size(&self, f: &OpenFile) -> Result<()> {
        self.report_size_with(f, None).await
    }

    /// Whether the handle has writes whose size is still to report.
    fn report_due(&self, f: &OpenFile) -> bool {
        f.was_written()
            && f.published_gen.load(Ordering::Acquire) != f.inflight.data_gen.load(Ordering::Acquire)
            && f.needs_publish.load(Ordering::Acquire)
    }

    /// [`Client::report_size`], taking along the attribute changes answered here
    /// that were taken from the file for it (`along`; sent alone if there is no size
    /// to report after all).
    async fn report_size_with(&self, f: &OpenFile, mut along: Option<set_behind::Pending>) -> Result<()> {
        // The generation before the size: a write bumps it again only once its end is in
        // the size (`io::write`), so the size read below covers every write this
        // generation counts.
        let gen = f.inflight.data_gen.load(Ordering::Acquire);
        // Taken before the size is read (one atomic step, so a write that sets it again
        // after growing the size is either seen here with its size, or left for the next
        // report).
        if !f.was_written()
            || f.published_gen.load(Ordering::Acquire) == gen
            || !f.needs_publish.swap(false, Ordering::AcqRel)
        {
            return match along {
                Some(p) => self.send_taken_behind(f, p).await,
                None => Ok(()),
            };
        }
        let epoch = f.inflight.trunc_epoch.load(Ordering::Acquire);
        let behind = along.as_ref().map(|p| Box::new(p.to_send()));
        let req =
            Request::MdsSizeUpdate { fid: f.fid, size: f.size(), mtime: f.report_mtime(), trunc_epoch: epoch, behind };
        let reported = match self.md(f.fid, req).await {
            Ok(Response::Attr(a)) => {
                if let Some(p) = &along {
                    self.sent_behind_with(f, p, &a);
                }
                Ok(())
            }
            Ok(Response::EpochMoved { trunc_epoch }) => {
                // Nothing applied: the changes go alone, before the report.
                let sent = match along.take() {
                    Some(p) => self.send_taken_behind(f, p).await,
                    None => Ok(()),
                };
                match sent {
                    Ok(()) => self.report_size_from_objects(f, trunc_epoch).await,
                    Err(e) => Err(e),
                }
            }
            Ok(r) => Err(unexpected("size update", &r)),
            Err(e) => Err(e),
        };
        match reported {
            Ok(()) => f.published_gen.store(gen, Ordering::Release),
            // Still to report: the next flush, fsync or the close tries again.
            Err(_) => f.needs_publish.store(true, Ordering::Release),
        }
        reported
    }

    /// After a truncate from elsewhere (the MDS answered [`Response::EpochMoved`]),
    /// the size this handle holds may predate the cut: the objects say what the file
    /// holds now. Once this client's writes to the file have landed, their sizes are
    /// glimpsed and reported under the new epoch, which the handle adopts.
    async fn report_size_from_objects(&self, f: &OpenFile, mut epoch: u64) -> Result<()> {
        for i in self.file_inflights(f.fid) {
            i.settle().await;
        }
        for _ in 0..EPOCH_RETRIES_MAX {
            let size = io::glimpse(self, f.fid, &f.layout()).await?;
            let req =
                Request::MdsSizeUpdate { fid: f.fid, size, mtime: f.report_mtime(), trunc_epoch: epoch, behind: None };
            match self.md(f.fid, req).await? {
                Response::Attr(a) => {
                    f.inflight.trunc_epoch.store(epoch, Ordering::Release);
                    f.set_size(a.size);
                    return Ok(());
                }
                // Truncated again meanwhile: glimpse again.
                Response::EpochMoved { trunc_epoch } => epoch = trunc_epoch,
                r => return Err(unexpected("size update", &r)),
            }
        }
        Err(ClientError::Errno(Errno::Again, format!("{}: truncated from elsewhere throughout the size report", f.fid)))
    }

    /// Closes a handle: a writer reports the file's new size and mtime to the MDS
    /// (what makes close-to-open consistency hold), and the MDS drops its open count
    /// (the last close of an unlinked file destroys it).
    pub async fn close(&self, f: OpenFile) -> Result<()> {
        self.close_shared(&f).await
    }

    /// [`Client::close`] of a handle that something else may still hold for a moment
    /// (the mount: a reader that has answered the kernel but not yet let go). Nothing
    /// may write through it afterwards.
    pub async fn close_shared(&self, f: &OpenFile) -> Result<()> {
        self.observe("close", Some(f.fid), 0, 0, async {
            // A file whose create failed was never open on the MDS.
            f.created().await?;
            let behind = self.send_behind_of(f).await;
            if let Some(b) = &f.behind {
                self.inner.sets_behind.closed(f.fid, b);
            }
            behind?;
            let flushed = f.inflight.drain().await;
            let unpublished = f.published_gen.load(Ordering::Acquire) != f.inflight.data_gen.load(Ordering::Acquire)
                && f.needs_publish.load(Ordering::Acquire);
            if !(f.was_written() && unpublished) {
                // Nothing to report: the MDS only needs to learn, soon, that the open
                // count dropped (it keeps an unlinked file while open). Such closes go
                // out together a few milliseconds later, one RPC for many.
                self.defer_close(f.fid).await;
                return flushed;
            }
            let (size, mtime) = (Some(f.size()), f.report_mtime());
            let trunc_epoch = f.inflight.trunc_epoch.load(Ordering::Acquire);
            match self.md(f.fid, Request::MdsClose { fid: f.fid, size, mtime, trunc_epoch }).await? {
                Response::Ok => flushed,
                Response::EpochMoved { trunc_epoch } => {
                    self.report_size_from_objects(f, trunc_epoch).await?;
                    flushed
                }
                r => Err(unexpected("close", &r)),
            }
        })
        .await
    }

    async fn defer_close(&self, fid: Fid) {
        let (first, full) = {
            let mut q = self.inner.closes.lock().expect("closes");
            q.push(fid);
            (q.len() == 1, q.len() >= CLOSE_BATCH_MAX)
        };
        if full {
            self.send_closes().await;
        } else if first {
            let c = self.clone();
            tokio::spawn(rpc::stats::in_current_job(async move {
                tokio::time::sleep(CLOSE_DELAY).await;
                c.send_closes().await;
            }));
        }
    }

    /// Sends every deferred close, one RPC per MDT. A failure is only logged: the MDS
    /// forgets a client's opens when its connection ends.
    async fn send_closes(&self) {
        let fids = std::mem::take(&mut *self.inner.closes.lock().expect("closes"));
        let mut by_mdt: HashMap<u32, Vec<Fid>> = HashMap::new();
        for fid in fids {
            by_mdt.entry(fid.mdt()).or_default().push(fid);
        }
        for fids in by_mdt.into_values() {
            let n = fids.len();
            match self.md(fids[0], Request::MdsCloseMany { fids }).await {
                Ok(Response::Ok) => {}
                Ok(r) => tracing::debug!("{n} deferred close(s): {}", unexpected("close", &r)),
                Err(e) => tracing::debug!("{n} deferred close(s) not delivered: {e}"),
            }
        }
    }

    /// Sends deferred closes now: before removing a name this client just closed (the
    /// file is then destroyed at once instead of left an orphan for the reaper), and
    /// for a caller counting RPCs that must not count them later.
    pub async fn settle_closes(&self) {
        if !self.inner.closes.lock().expect("closes").is_empty() {
            self.send_closes().await;
        }
    }

    /// Takes, changes or releases a byte-range lock (`end` inclusive). Returns the
    /// conflicting lock when it cannot be granted; with `wait`, keeps asking until it is.
    pub async fn set_lock(&self, fid: Fid, lock: LockRequest, wait: bool) -> Result<Option<LockInfo>> {
        self.set_lock_until(fid, lock, wait, || false).await
    }

    /// As [`Client::set_lock`], and a wait ends with `EINTR` once `interrupted` says so
    /// (a signal came for the waiting process). It is asked between the MDS's wait
    /// slices and every [`INTERRUPT_POLL`] while waiting for a turn. A lock granted
    /// before it is noticed is kept, as a local lock granted just before a signal is.
    pub async fn set_lock_until(
        &self,
        fid: Fid,
        lock: LockRequest,
        wait: bool,
        interrupted: impl Fn() -> bool,
    ) -> Result<Option<LockInfo>> {
        let len = lock.end.saturating_sub(lock.start).saturating_add(1);
        let intr = || ClientError::Errno(Errno::Intr, format!("{fid}: lock wait interrupted by a signal"));
        self.observe("setlk", Some(fid), lock.start, len, async {
            let mut first = true;
            loop {
                // A turn each time it has to wait: waiters queued here get theirs as the
                // MDS's wait slices end, whatever lock they wait for. So a lock is first
                // asked for without waiting, with no turn: one that is free (another
                // file's, a holder's own change of its lock) never queues behind the
                // waiters. An unlock never waits, even sent as F_SETLKW (as Python's
                // lockf does).
                let waits = wait && lock.lock != LockType::Unlock && !first;
                first = false;
                let mut turn = None;
                while waits && turn.is_none() {
                    if interrupted() {
                        return Err(intr());
                    }
                    let ask = self.inner.lock_waits.acquire();
                    turn = tokio::time::timeout(INTERRUPT_POLL, ask).await.ok().map(|t| t.expect("never closed"));
                }
                let req = Request::MdsSetLock { fid, lock, wait: waits, reclaim: false };
                let gate = self.inner.lock_gate.read().await;
                match self.md(fid, req).await? {
                    Response::Ok => {
                        self.inner.held_locks.apply(fid, &lock);
                        drop(gate);
                        return Ok(None);
                    }
                    Response::Lock(Some(c)) if !wait => return Ok(Some(c)),
                    Response::Lock(_) if interrupted() => return Err(intr()),
                    Response::Lock(_) => continue,
                    r => return Err(unexpected("setlk", &r)),
                }
            }
        })
        .await
    }

    /// Whether this client holds any file open.
    pub(crate) fn holds_open(&self) -> bool {
        let m = self.inner.open_files.lock().expect("open files");
        m.values().any(|l| l.iter().any(|w| w.strong_count() > 0))
    }

    /// Tells the MDS of `mdts`, reconnected to (where they were, or where they moved),
    /// what this client holds on them: its open handles (so files unlinked while open
    /// outlive a restart), then its locks (see [`crate::held_locks`]). What it refuses
    /// is logged as lost.
    pub(crate) async fn replay(&self, mdts: &[u32]) {
        let _alone = self.inner.lock_gate.write().await;
        let served_there = |fid: Fid| mdts.contains(&fid.mdt());
        let opens: Vec<(Fid, u32, bool)> = {
            let m = self.inner.open_files.lock().expect("open files");
            m.iter()
                .filter(|(fid, _)| served_there(**fid))
                .filter_map(|(fid, list)| {
                    let live: Vec<_> = list.iter().filter_map(|w| w.upgrade()).collect();
                    let write = live.iter().any(|i| i.writable.load(Ordering::Acquire));
                    (!live.is_empty()).then_some((*fid, live.len() as u32, write))
                })
                .collect()
        };
        if !opens.is_empty() {
            tracing::info!(?mdts, files = opens.len(), "replaying the opens held on the MDTs");
        }
        for (fid, handles, write) in opens {
            let req = Request::MdsReclaimOpen { fid, handles, write };
            match crate::deferred::exempt(self.md(fid, req)).await {
                Ok(Response::Ok) => {}
                Ok(r) => tracing::error!(%fid, "an open handle could not be counted again: unexpected answer {r:?}"),
                Err(e) => tracing::error!(%fid, "an open handle could not be counted again: {e}"),
            }
        }
        let held = self.inner.held_locks.held(served_there);
        if held.is_empty() {
            return;
        }
        tracing::info!(?mdts, locks = held.len(), "replaying the locks held on the MDTs");
        for (fid, lock) in held {
            let req = Request::MdsSetLock { fid, lock, wait: false, reclaim: true };
            let lost = match crate::deferred::exempt(self.md(fid, req)).await {
                Ok(Response::Ok) => continue,
                Ok(Response::Lock(Some(c))) => {
                    format!("another owner (pid {}) holds [{}, {}] now", c.pid, c.start, c.end)
                }
                Ok(r) => format!("unexpected answer {r:?}"),
                Err(e) => e.to_string(),
            };
            tracing::error!(
                %fid, owner = lock.owner, pid = lock.pid, start = lock.start, end = lock.end,
                "a lock held before the MDS connection was lost could not be taken again: {lost}"
            );
            self.inner.held_locks.forget(fid, &lock);
        }
    }

    /// The first lock that would conflict with the described one (`F_GETLK`).
    pub async fn get_lock(&self, fid: Fid, lock: LockRequest) -> Result<Option<LockInfo>> {
        self.observe("getlk", Some(fid), lock.start, 0, async {
            let req = Request::MdsGetLock { fid, lock };
            answer!("getlk", self.md(fid, req).await?, Response::Lock(c) => c)
        })
        .await
    }

    /// The size of a file as its objects show it (Lustre's glimpse): needed while
    /// another client writes it and has not closed yet.
    pub async fn glimpse_size(&self, attr: &Attr) -> Result<u64> {
        self.observe("glimpse_size", Some(attr.fid), 0, 0, async {
            let Some(layout) = &attr.layout else {
                return Ok(attr.size);
            };
            Ok(attr.size.max(io::glimpse(self, attr.fid, layout).await?))
        })
        .await
    }
}
