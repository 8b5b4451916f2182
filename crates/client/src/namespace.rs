//! The namespace operations of [`Client`]: lookups, creates and opens, links and
//! removals, renames, listings, attributes and xattrs, layouts and truncates, and the
//! attributes of directories this client changed (answered from here for a while).
//! Each goes to the MDT that owns its FID (or its name's shard), through
//! [`Client::observe`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layout::{Layout, LayoutChange, LayoutSpec};
use proto::msg::{Request, Response, XATTR_NAME_MAX};

use crate::*;

impl Client {
    pub async fn lookup(&self, creds: &Creds, parent: Fid, name: &str) -> Result<Attr> {
        self.observe("lookup", Some(parent), 0, 0, async {
            let dir = self.shard(parent, name);
            if self.inner.leases.absent(dir, name) {
                return Err(ClientError::Errno(Errno::NoEnt, format!("{name} not found")));
            }
            if self.inner.cfg.statahead && dir == parent {
                if let Some(attr) = self.inner.statahead.take(dir, name, creds) {
                    self.inner.first_bytes.note(&attr);
                    return Ok(attr);
                }
                if let Some(fetch) = self.inner.statahead.missed(dir, name) {
                    self.spawn_statahead(creds.clone(), fetch);
                }
            }
            let req = |dir| Request::MdsLookup { creds: creds.clone(), parent: dir, name: name.to_string() };
            let attr = answer!("lookup", self.md_entry(parent, name, req).await?.response, Response::Attr(a) => a)?;
            self.inner.first_bytes.note(&attr);
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Fetches the attributes of the entries after `fetch.after` for the lookups
    /// that follow, in the background (see [`statahead`]).
    fn spawn_statahead(&self, creds: Creds, fetch: statahead::Fetch) {
        let c = self.clone();
        tokio::spawn(rpc::stats::in_current_job(async move {
            let req = Request::MdsStatahead {
                creds: creds.clone(),
                fid: fetch.dir,
                after: Some(fetch.after.clone()),
                max: statahead::CHUNK,
            };
            match c.md(fetch.dir, req).await {
                Ok(Response::EntryAttrs { entries, .. }) => c.inner.statahead.fill(&fetch, &creds, entries),
                Ok(r) => {
                    tracing::debug!(dir = %fetch.dir, "statahead: {}", unexpected("statahead", &r));
                    c.inner.statahead.failed(&fetch);
                }
                Err(e) => {
                    tracing::debug!(dir = %fetch.dir, "statahead: {e}");
                    c.inner.statahead.failed(&fetch);
                }
            }
        }));
    }

    /// Attributes of `fid` (of a striped directory, summed over its shards).
    pub async fn getattr(&self, fid: Fid) -> Result<Attr> {
        self.observe("getattr", Some(fid), 0, 0, async {
            let epoch = self.metadata_epoch();
            let attr = answer!("getattr", self.md(fid, Request::MdsGetattr { fid }).await?, Response::Attr(a) => a)?;
            self.inner.first_bytes.note(&attr);
            // A directory whose entries no other client may change (this client holds
            // its lease), as the MDS has it now: what this client's own unlinks in it
            // start from (`rm -rf` stats each directory before emptying it), unless
            // this client changed anything while the answer was on its way.
            if attr.kind == FileKind::Dir
                && attr.stripes.is_none()
                && self.inner.leases.trusted(fid)
                && self.metadata_epoch() == epoch
            {
                self.note_dir(attr.clone());
            }
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Creates (or, without `exclusive`, opens an existing) file: one MDS round trip
    /// returning attributes and layout. Returns the handle and whether it existed.
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        exclusive: bool,
        flags: OpenFlags,
        layout: Option<LayoutSpec>,
    ) -> Result<(OpenFile, Attr, bool)> {
        self.observe("create", Some(parent), 0, 0, async {
            if let Some(l) = &layout {
                l.validate()?;
            }
            let req = |dir| Request::MdsCreate {
                creds: creds.clone(),
                parent: dir,
                name: name.to_string(),
                mode,
                exclusive,
                flags,
                layout: layout.clone(),
            };
            let dir = self.shard(parent, name);
            if layout.is_none() && dir == parent {
                if let Some(made) = self.create_here(creds, dir, name, mode, flags) {
                    let (f, attr) = made?;
                    return Ok((f, attr, false));
                }
            }
            let unknown = self.inner.leases.add(dir, name);
            let created_in = unknown.then_some((dir, self.inner.moves.load(Ordering::Acquire)));
            let r = if unknown {
                // A name the lease says is new cannot be a file whose flush is deferred.
                deferred::exempt(self.md_change(parent, name, req)).await
            } else {
                self.md_change(parent, name, req).await
            };
            if !exclusive && r.as_ref().is_err_and(|e| e.errno() == Errno::XDev) {
                // An existing link to a file on another MDT: opened there.
                let (f, attr) = self.open_link_elsewhere(creds, parent, name, flags).await?;
                return Ok((f, attr, true));
            }
            if unknown && matches!(r, Ok(Response::Created { existed: true, .. })) {
                // An existing name the lease did not know of: the lease was wrong.
                self.inner.leases.forget(dir);
            }
            match r? {
                Response::Created { attr, existed, dir, free } => {
                    match dir {
                        Some(d) => {
                            if !existed && unknown && self.inner.cfg.dir_leases {
                                self.inner.creates.learn(self.shard(parent, name), &attr, &d, free);
                            }
                            self.note_dir(d)
                        }
                        None => {
                            self.forget_dir(self.shard(parent, name));
                        }
                    }
                    let mut attr = attr;
                    let mut f = OpenFile::new(&attr, flags, creds)?;
                    if !existed {
                        f.created_in = created_in;
                        if let Some((dir, _)) = created_in {
                            self.track_created(&mut f, &attr, dir);
                        }
                    }
                    self.register_open(&f);
                    if existed && flags.truncate {
                        self.truncate_open(creds, &f, 0).await?;
                        attr.size = 0;
                    }
                    Ok((f, attr, existed))
                }
                r => Err(unexpected("create", &r)),
            }
        })
        .await
    }

    /// The create of `name` in `dir`, answered here and sent in the background, if it
    /// may be (see [`async_create`]): `None` when it must go to the MDS as usual.
    fn create_here(
        &self,
        creds: &Creds,
        dir: Fid,
        name: &str,
        mode: u32,
        flags: OpenFlags,
    ) -> Option<Result<(OpenFile, Attr)>> {
        if !self.inner.cfg.dir_leases || name.len() > async_create::NAME_MAX || name.contains('/') {
            return None;
        }
        let mut tpl = self.inner.creates.template(dir, creds)?;
        if tpl.free && tpl.served > 0 {
            // As the MDS's round robin would: a burst of creates spreads over the OSTs.
            let config = self.inner.config.read().expect("config");
            async_create::rotate(&mut tpl.layout, tpl.served, &config);
        }
        let (fid, ask) = self.inner.creates.take_fid(dir.mdt());
        if ask {
            self.spawn_fid_grant(dir.mdt());
        }
        let fid = fid?;
        // Counted before the lease is checked: a revocation after the check waits for
        // the create.
        let Some(ticket) = self.inner.deferred.begin_on(0, [Some(fid), Some(dir)]) else {
            self.inner.creates.put_back(fid);
            return None;
        };
        let Some(lease) = self.inner.leases.claim(dir, name) else {
            self.inner.creates.put_back(fid);
            return None;
        };
        let attr = async_create::new_file_attr(fid, creds, mode, &tpl);
        // Attributes fetched before (the directory's) may predate this create.
        self.inner.statahead.changed();
        self.inner.creates.answered.fetch_add(1, Ordering::Relaxed);
        let mut f = match OpenFile::new(&attr, flags, creds) {
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        // The directory's times as the MDS will set them, for the kernel's re-read of
        // its attributes after the create (see `recent_dir_attr`).
        self.touch_recent_dir(dir, attr.ctime, Duration::MAX);
        let (gate, held) = async_create::gate();
        f.created = Some(gate.clone());
        f.created_in = Some((dir, self.inner.moves.load(Ordering::Acquire)));
        self.track_created(&mut f, &attr, dir);
        self.register_open(&f);
        let dom_first = tpl.dom_first();
        let (creds, name, layout) = (creds.clone(), name.to_string(), tpl.layout);
        let hurry = self.inner.deferred.hurried();
        let c = self.clone();
        tokio::spawn(rpc::stats::in_current_job(async move {
            // Held back for the file's first bytes, if they go to its MDT (see
            // `async_create`); those of a file on OSTs go there after it.
            let data = if dom_first { async_create::first_bytes(held, hurry).await } else { Vec::new() };
            let req = Request::MdsCreateGranted {
                creds,
                parent: dir,
                name: name.clone(),
                mode,
                flags,
                fid,
                layout,
                data,
                lease,
            };
            let r = deferred::exempt(c.md(dir, req)).await;
            let outcome = match r {
                Ok(Response::Created { attr, dir: Some(d), .. }) if attr.fid == fid => {
                    c.note_dir(d);
                    Ok(())
                }
                Ok(r) => Err(unexpected("create", &r)),
                Err(e) => Err(e),
            };
            if let Err(e) = &outcome {
                tracing::warn!(%dir, name, %fid, "a create answered here was refused; the file's writes, flush and close fail: {e}");
                // The lease's idea of the directory is in doubt (see `track_entries`).
                c.inner.leases.forget(dir);
                c.inner.creates.forget(dir);
                c.inner.deferred.failed(fid, e.to_string());
            }
            gate.open(outcome.map_err(|e| (e.errno(), e.to_string())));
            drop(ticket);
        }));
        Some(Ok((f, attr)))
    }

    /// Asks MDT `mdt` for FIDs to give files created here, in the background.
    fn spawn_fid_grant(&self, mdt: u32) {
        let c = self.clone();
        tokio::spawn(rpc::stats::in_current_job(async move {
            let req = Request::MdsFidGrant { mdt, count: async_create::GRANT_COUNT };
            let grant = match deferred::exempt(c.md(Fid::new(mdt, 0, 0), req)).await {
                Ok(Response::FidGrant { first, count }) if first.mdt() == mdt => Some((first, count)),
                Ok(r) => {
                    tracing::info!(
                        mdt,
                        "no FID grant ({}): creates go to the MDS for now",
                        unexpected("fid grant", &r)
                    );
                    None
                }
                Err(e) => {
                    tracing::info!(mdt, "no FID grant ({e}): creates go to the MDS for now");
                    None
                }
            };
            c.inner.creates.granted(mdt, grant);
        }));
    }

    /// Opens an existing file (permissions checked by the MDS). With `truncate`, the
    /// file is emptied.
    pub async fn open(&self, creds: &Creds, fid: Fid, flags: OpenFlags) -> Result<(OpenFile, Attr)> {
        let req = Request::MdsOpen { creds: creds.clone(), fid, flags };
        self.observe("open", Some(fid), 0, 0, async {
            let sent = self.open_sent();
            let reply = self.md_reply(fid, req).await?;
            self.opened(creds, sent, reply, flags).await
        })
        .await
    }

    /// Opens `name` in `parent`: the lookup and the open in one MDS round trip
    /// (Lustre's intent open), and for a small Data-on-MDT file its bytes too, so
    /// reading it needs nothing more.
    pub async fn open_at(&self, creds: &Creds, parent: Fid, name: &str, flags: OpenFlags) -> Result<(OpenFile, Attr)> {
        self.observe("open", Some(parent), 0, 0, async {
            if self.inner.leases.absent(self.shard(parent, name), name) {
                return Err(ClientError::Errno(Errno::NoEnt, format!("{name} not found")));
            }
            let req = |dir| Request::MdsOpenAt { creds: creds.clone(), parent: dir, name: name.to_string(), flags };
            let sent = self.open_sent();
            match self.md_entry(parent, name, req).await {
                Err(e) if e.errno() == Errno::XDev => self.open_link_elsewhere(creds, parent, name, flags).await,
                Err(e) => Err(e),
                Ok(reply) => self.opened(creds, sent, reply, flags).await,
            }
        })
        .await
    }

    /// Opens `name` in `parent`, an entry naming a file whose inode is on another MDT
    /// (the parent's MDT answered EXDEV): looked up, then opened on its own MDT.
    async fn open_link_elsewhere(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        flags: OpenFlags,
    ) -> Result<(OpenFile, Attr)> {
        let fid = self.lookup(creds, parent, name).await?.fid;
        let req = Request::MdsOpen { creds: creds.clone(), fid, flags };
        let sent = self.open_sent();
        let reply = self.md_reply(fid, req).await?;
        self.opened(creds, sent, reply, flags).await
    }

    /// Taken before an open is sent: what its answer is judged against.
    pub(crate) fn open_sent(&self) -> OpenSent {
        OpenSent { writes: io::write_seq(), xattrs: self.inner.xattrless.sent() }
    }

    /// Whether a write of this client to `fid` was on its way at any time since the
    /// open sent at `sent`, or is now.
    pub(crate) fn written_since(&self, fid: Fid, sent: OpenSent) -> bool {
        self.file_inflights(fid).iter().any(|i| i.wrote_since(sent.writes))
    }

    /// Makes the handle an open (`MdsOpen` or `MdsOpenAt`, sent at `sent`) answered.
    pub(crate) async fn opened(
        &self,
        creds: &Creds,
        sent: OpenSent,
        reply: rpc::Reply,
        flags: OpenFlags,
    ) -> Result<(OpenFile, Attr)> {
        {
            let (mut attr, data) = match reply.response {
                Response::Attr(a) => {
                    self.inner.xattrless.unnote(a.fid);
                    (a, None)
                }
                Response::OpenedWithoutXattrs { attr } => {
                    self.inner.xattrless.note(attr.fid, sent.xattrs);
                    (attr, None)
                }
                // A small Data-on-MDT file: its bytes came with the open.
                Response::OpenedWithData { attr } => {
                    self.inner.xattrless.unnote(attr.fid);
                    (attr, Some(reply.payload))
                }
                r => return Err(unexpected("open", &r)),
            };
            let f = OpenFile::new(&attr, flags, creds)?;
            // Bytes the open returned predate a write of this client still on its way
            // to the MDT when the open was sent: such an open reads like any other.
            let quiet = || !self.written_since(attr.fid, sent);
            if let Some(data) = data.filter(|_| quiet()) {
                f.keep_data(data);
            }
            self.register_open(&f);
            // Whatever the MDS's size says: it lags unpublished writes.
            if flags.truncate {
                self.truncate_open(creds, &f, 0).await?;
                attr.size = 0;
            }
            Ok((f, attr))
        }
    }

    pub async fn mkdir(&self, creds: &Creds, parent: Fid, name: &str, mode: u32) -> Result<Attr> {
        self.mkdir_on(creds, parent, name, mode, None).await
    }

    /// Makes a directory whose inode is on MDT `on` (`braid mkdir -i K`, a remote
    /// directory; its entry stays on the parent's MDT), or as the parent's default
    /// for new directories says (on the parent's MDT without one) for `None`.
    pub async fn mkdir_on(&self, creds: &Creds, parent: Fid, name: &str, mode: u32, on: Option<u32>) -> Result<Attr> {
        self.mkdir_with(creds, parent, name, mode, on.map(DirSpec::on)).await
    }

    /// Makes a directory placed over MDTs as `spec` asks (`braid mkdir -i K -c N`: a
    /// remote or striped directory), or as the parent's default says for `None`.
    pub async fn mkdir_with(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        spec: Option<DirSpec>,
    ) -> Result<Attr> {
        self.observe("mkdir", Some(parent), 0, 0, async {
            let dir = self.shard(parent, name);
            let template = self.forget_dir(dir);
            // The server first: making its connection is what tells whether its
            // callbacks can reach this client.
            self.mdt(dir).await?;
            // A lease comes from the MDT holding the directory's entries: only its own.
            let here = spec.is_none_or(|s| s.count == 1 && s.mdt == dir.mdt());
            let lease = here && self.inner.cfg.dir_leases && self.inner.leases_reachable.load(Ordering::Acquire);
            let req =
                |d| Request::MdsMkdir { creds: creds.clone(), parent: d, name: name.to_string(), mode, lease, spec };
            self.inner.leases.add(dir, name);
            let r = self.md_entry(parent, name, req).await;
            self.track_entries(&r, &[dir]);
            let reply = r?;
            match reply.response {
                Response::DirMade { attr, parent: dir, lease } => {
                    // A directory made in one this client creates in: its files get
                    // the same layout, and may be answered here from the start.
                    if let Some(tpl) = template.filter(|_| spec.is_none() && attr.stripes.is_none()) {
                        self.inner.creates.inherit(tpl, &dir, &attr);
                    }
                    self.note_dir(dir);
                    // The new directory's own attributes too: the kernel asks for them
                    // after each create in it (and `tar x` creates in it next).
                    if attr.stripes.is_none() {
                        self.note_dir(attr.clone());
                    }
                    self.learn_stripes(&attr);
                    // An answer to a request sent again may be the reply cache's, for a
                    // lease the MDS dropped with the connection the first try was on.
                    if let (Some(id), false) = (lease, reply.resent) {
                        self.inner.leases.install(attr.fid, id, reply.session);
                        self.give_back_leases();
                    }
                    Ok(attr)
                }
                r => Err(unexpected("mkdir", &r)),
            }
        })
        .await
    }

    pub async fn symlink(&self, creds: &Creds, parent: Fid, name: &str, target: &str) -> Result<Attr> {
        let req = |dir| Request::MdsSymlink {
            creds: creds.clone(),
            parent: dir,
            name: name.to_string(),
            target: target.to_string(),
        };
        self.observe("symlink", Some(parent), 0, 0, self.make_leaf(parent, name, req)).await
    }

    /// Makes a special file (FIFO, character or block device, socket): an inode in
    /// the namespace that never touches an OST.
    pub async fn mknod(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let req =
            |dir| Request::MdsMknod { creds: creds.clone(), parent: dir, name: name.to_string(), kind, mode, rdev };
        self.observe("mknod", Some(parent), 0, 0, self.make_leaf(parent, name, req)).await
    }

    /// Sends the request `build(shard)` makes, which makes the entry `name` in
    /// `parent` for a new inode without data (a symlink or a special file), and
    /// returns the inode's attributes.
    async fn make_leaf(&self, parent: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<Attr> {
        self.forget_dir(self.shard(parent, name));
        self.inner.leases.add(self.shard(parent, name), name);
        let op = build(parent).op_name();
        answer!(op, self.md_change(parent, name, build).await?, Response::Attr(a) => a)
    }

    pub async fn readlink(&self, fid: Fid) -> Result<String> {
        md_op!(self, "readlink", fid, Request::MdsReadlink { fid }, Response::Link(t) => t)
    }

    pub async fn link(&self, creds: &Creds, fid: Fid, parent: Fid, name: &str) -> Result<Attr> {
        self.observe("link", Some(fid), 0, 0, async {
            self.inner.moves.fetch_add(1, Ordering::AcqRel);
            self.forget_dir(self.shard(parent, name));
            self.inner.leases.add(self.shard(parent, name), name);
            let req = |dir| Request::MdsLink { creds: creds.clone(), fid, parent: dir, name: name.to_string() };
            answer!("link", self.md_change(parent, name, req).await?, Response::Attr(a) => a)
        })
        .await
    }

    /// Moves directory `name` in `parent` to MDT `mdt` under a new FID, with its
    /// entries (one step of `braid migrate -m`, see [`Request::MdsMigrate`]);
    /// returns its attributes where it now is. `EAGAIN` if it changed meanwhile.
    pub async fn migrate_mdt(&self, creds: &Creds, parent: Fid, name: &str, mdt: u32) -> Result<Attr> {
        self.observe("migrate_mdt", Some(parent), 0, 0, async {
            self.inner.moves.fetch_add(1, Ordering::AcqRel);
            self.forget_dir(self.shard(parent, name));
            let req = |dir| Request::MdsMigrate { creds: creds.clone(), parent: dir, name: name.to_string(), mdt };
            answer!("migrate_mdt", self.md_change(parent, name, req).await?, Response::Attr(a) => a)
        })
        .await
    }

    pub async fn unlink(&self, creds: &Creds, parent: Fid, name: &str) -> Result<()> {
        let req = |dir| Request::MdsUnlink { creds: creds.clone(), parent: dir, name: name.to_string() };
        self.observe("unlink", Some(parent), 0, 0, async {
            self.inner.sets_behind.give_up_in(self.shard(parent, name));
            self.settle_closes().await;
            self.remove_entry(parent, name, req).await
        })
        .await
    }

    /// [`Client::unlink`] for a caller that has already looked `name` up and found a
    /// file (not a directory) that `creds` may remove: the kernel under
    /// `default_permissions`, which checks that before it asks. Where this client
    /// holds the lease on the directory (no other client can have changed its
    /// entries since, nor look at them before the MDS takes the lease back) and knows
    /// the directory's attributes as its last change left them (less than the
    /// kernel's attribute time ago: the kernel asks for them after every unlink, and
    /// they are answered here, see [`Client::recent_dir_attr`]), the unlink is
    /// answered here and sent in the background, as a deferred flush is (see
    /// [`deferred`]): every later MDS request of this client, and the ack of a lease
    /// revocation, waits for it; so `rm -rf` sends a directory's unlinks together and
    /// waits once, at the `rmdir`. One refused after all (only an MDS failing can) is
    /// logged, drops the lease, and is reported by the next fsync of the directory.
    pub async fn unlink_vetted(&self, creds: &Creds, parent: Fid, name: &str) -> Result<()> {
        let dir = self.shard(parent, name);
        self.inner.sets_behind.give_up_in(dir);
        let Some(ticket) = self.inner.removals.begin(0) else { return self.unlink(creds, parent, name).await };
        // The lease is checked after the ticket is counted: a revocation after the
        // check waits for the removal.
        let at = Timespec::now();
        let lease = self.inner.leases.trusted_id(dir);
        let Some(lease) = lease.filter(|_| self.touch_recent_dir(dir, at, async_create::TEMPLATE_AGE)) else {
            // Given back first: the unlink waits for every removal under way.
            drop(ticket);
            return self.unlink(creds, parent, name).await;
        };
        self.inner.statahead.changed();
        self.inner.unlinks_answered.fetch_add(1, Ordering::Relaxed);
        let (c, creds, name) = (self.clone(), creds.clone(), name.to_string());
        tokio::spawn(rpc::stats::in_current_job(tracer::as_caller(async move {
            c.observe("unlink", Some(parent), 0, 0, c.finish_removal(&creds, parent, &name, at, lease)).await.ok();
            drop(ticket);
        })));
        Ok(())
    }

    /// Sends an unlink [`Client::unlink_vetted`] answered under lease `lease`.
    async fn finish_removal(&self, creds: &Creds, parent: Fid, name: &str, at: Timespec, lease: u64) -> Result<()> {
        // Flushes deferred before it land first (its request skips the wait, so as not
        // to wait for the removals sent with it).
        self.inner.deferred.idle().await;
        // At the time the kernel was told (the directory's times it now shows).
        let req = |dir| Request::MdsUnlinkAt { creds: creds.clone(), parent: dir, name: name.to_string(), at, lease };
        let r = deferred::exempt(async {
            self.settle_closes().await;
            self.md_change(parent, name, req).await
        })
        .await;
        let r = r.and_then(|r| answer!("unlink", r, Response::DirChanged { .. } => ()));
        match &r {
            Ok(()) => {}
            // Removed meanwhile by a caller that looked before this client's lease.
            Err(e) if e.errno() == Errno::NoEnt => tracing::debug!(%parent, name, "unlinked already: {e}"),
            Err(e) => {
                tracing::warn!(%parent, name, "an unlink answered here was refused; the next fsync of the directory fails: {e}");
                self.forget_dir(self.shard(parent, name));
                self.inner.removals.failed(parent, format!("unlink of {name:?}: {e}"));
            }
        }
        r
    }

    pub async fn rmdir(&self, creds: &Creds, parent: Fid, name: &str) -> Result<()> {
        let req = |dir| Request::MdsRmdir { creds: creds.clone(), parent: dir, name: name.to_string() };
        self.observe("rmdir", Some(parent), 0, 0, self.remove_entry(parent, name, req)).await
    }

    /// Sends the request `build(shard)` makes, which removes `name` from `parent` (an
    /// unlink or an rmdir), and remembers the directory as the MDS left it.
    async fn remove_entry(&self, parent: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<()> {
        let op = build(parent).op_name();
        let dir = answer!(op, self.md_change(parent, name, build).await?, Response::DirChanged { dir } => dir)?;
        self.note_dir(dir);
        Ok(())
    }

    pub async fn rename(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        new_parent: Fid,
        new_name: &str,
        flags: RenameFlags,
    ) -> Result<()> {
        self.observe("rename", Some(parent), 0, 0, async {
            self.inner.moves.fetch_add(1, Ordering::AcqRel);
            self.forget_dir(self.shard(parent, name));
            self.forget_dir(self.shard(new_parent, new_name));
            // A directory moved (its ctime and `..` change) is named here, not known
            // by FID: nothing known of any directory's attributes is handed on.
            self.inner.recent_dirs.lock().expect("recent dirs").clear();
            self.settle_closes().await;
            let req = |from, to| Request::MdsRename {
                creds: creds.clone(),
                parent: from,
                name: name.to_string(),
                new_parent: to,
                new_name: new_name.to_string(),
                flags,
            };
            let dirs = [self.shard(new_parent, new_name), self.shard(parent, name)];
            self.inner.leases.add(dirs[0], new_name);
            // To the new entry's MDT, which coordinates a rename from another MDT.
            let r = self.md_entries2((parent, name), Some((new_parent, new_name)), req).await.map(|r| r.response);
            self.track_entries(&r, &dirs);
            answer!("rename", r?, Response::Ok => ())
        })
        .await
    }

    /// One batch of directory entries after `after` (name order), of every shard of
    /// a striped directory.
    pub async fn readdir(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        self.observe("readdir", Some(fid), 0, 0, self.readdir_merged(creds, fid, after, max)).await
    }

    /// Every entry of a directory.
    pub async fn readdir_all(&self, creds: &Creds, fid: Fid) -> Result<Vec<DirEntry>> {
        self.observe("readdir_all", Some(fid), 0, 0, async {
            let mut all = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let (batch, eof) = self.readdir(creds, fid, after.as_deref(), 1024).await?;
                after = batch.last().map(|e| e.name.clone());
                all.extend(batch);
                if eof || after.is_none() {
                    return Ok(all);
                }
            }
        })
        .await
    }

    /// Changes attributes. A size change punches the OST objects first, so a crash in
    /// between leaves zeros (never stale bytes) past the new size.
    ///
    /// Every object is cut to the new size whatever size the MDS holds: while a file
    /// is open for writing the MDS's size lags the bytes on the OSTs (writers publish
    /// it at close and fsync), and a cut decided from it would leave bytes past the
    /// new end that a later extension would bring back.
    pub async fn setattr(&self, creds: &Creds, fid: Fid, set: SetAttr) -> Result<Attr> {
        self.observe("setattr", Some(fid), set.size.unwrap_or(0), 0, async {
            self.give_up_behind(fid);
            self.forget_dir(fid);
            if let Some(size) = set.size {
                let attr = self.getattr(fid).await?;
                // Cut nothing the MDS would refuse to truncate (it checks again).
                check_truncate(&attr, creds, set.by_writer)?;
                if let Some(layout) = attr.layout {
                    let layout = self.layout_below(creds, fid, Arc::new(layout), size).await?;
                    self.cut_objects(fid, &layout, size).await?;
                }
            }
            let times = self.before_times_set(fid, &set).await;
            let req = Request::MdsSetattr { creds: creds.clone(), fid, set };
            let attr = answer!("setattr", self.md(fid, req).await?, Response::Attr(a) => a)?;
            times_set(times);
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Before a setattr of `fid` that sets its mtime: waits until the writes of
    /// every handle of the file in this client have landed (a DoM write sets the
    /// mtime as it lands), and returns each handle with its data generation then, for
    /// [`times_set`]. Lustre's client flushes its dirty pages before such a setattr
    /// for the same reason.
    async fn before_times_set(&self, fid: Fid, set: &SetAttr) -> Vec<(Arc<io::Inflight>, u64)> {
        if set.mtime.is_none() {
            return Vec::new();
        }
        let mut handles = Vec::new();
        for i in self.file_inflights(fid) {
            i.settle().await;
            let gen = i.data_gen.load(Ordering::Acquire);
            handles.push((i, gen));
        }
        handles
    }

    /// Changes the layout of an existing file: instantiates components, or adds or
    /// deletes trailing ones (`setstripe --component-add/--component-del`). Returns
    /// the file's attributes with the layout as it now is.
    pub async fn change_layout(&self, creds: &Creds, fid: Fid, change: LayoutChange) -> Result<Attr> {
        let req = Request::MdsLayoutChange { creds: creds.clone(), fid, change };
        md_op!(self, "layout_change", fid, req, Response::Attr(a) => a)
    }

    /// Before a truncate or hole punch through a handle: a layout that may have grown
    /// since the handle took it (components instantiated or added by another client)
    /// is asked for again, so the cut reaches every object that holds bytes.
    pub(crate) async fn refresh_unsettled_layout(&self, f: &OpenFile) -> Result<()> {
        if f.layout().is_settled() {
            return Ok(());
        }
        if let Some(fresh) = self.getattr(f.fid).await?.layout {
            f.replace_layout(fresh);
        }
        Ok(())
    }

    /// The data half of a truncate: waits for this client's writes to the file still
    /// on their way (a write that returned before the truncate must not land after
    /// the cut), drops read-ahead, and cuts every object to what `size` needs.
    async fn cut_objects(&self, fid: Fid, layout: &Layout, size: u64) -> Result<()> {
        self.drain_file(fid).await?;
        // Before and after: a read that fetched the old bytes while the cut was on
        // its way must not leave them in the SSD cache.
        self.cache_invalidate(fid, size, u64::MAX - size);
        let r = io::punch(self, fid, layout, size).await;
        self.cache_invalidate(fid, size, u64::MAX - size);
        r
    }

    /// A setattr through an open handle: with a size, the objects are cut through the
    /// handle's layout (no layout lookup), and the handle adopts the new size and
    /// truncate epoch, so its later size reports need no glimpse.
    async fn setattr_through(&self, creds: &Creds, f: &OpenFile, set: SetAttr) -> Result<Attr> {
        f.created().await?;
        let size = set.size;
        if let Some(size) = size {
            self.refresh_unsettled_layout(f).await?;
            let layout = self.instantiate(f, size).await?;
            self.cut_objects(f.fid, &layout, size).await?;
        }
        let times = self.before_times_set(f.fid, &set).await;
        let req = Request::MdsSetattr { creds: creds.clone(), fid: f.fid, set };
        let a = answer!("setattr", self.md(f.fid, req).await?, Response::Attr(a) => a)?;
        times_set(times);
        if let Some(size) = size {
            f.set_size(size);
            f.inflight.trunc_epoch.store(a.trunc_epoch, Ordering::Release);
        }
        Ok(a)
    }

    async fn truncate_open(&self, creds: &Creds, f: &OpenFile, size: u64) -> Result<()> {
        self.give_up_behind(f.fid);
        f.created().await?;
        // Opened for writing (or with O_TRUNC): permission was checked at open.
        let by_writer = f.flags.write || f.flags.truncate;
        let set = SetAttr { size: Some(size), by_writer, ..Default::default() };
        self.setattr_through(creds, f, set).await.map(|_| ())
    }

    /// Truncates an open file (ftruncate).
    pub async fn ftruncate(&self, creds: &Creds, f: &OpenFile, size: u64) -> Result<()> {
        self.observe("truncate", Some(f.fid), size, 0, self.truncate_open(creds, f, size)).await
    }

    /// Every handle of `fid` in this client takes the truncate epoch of a truncate
    /// this client just made (`trunc_epoch` from its answer), so their size reports
    /// need no glimpse. Only for a caller that has also set every such handle's size
    /// to the new size (the mount, whose handles of one file share one size cell):
    /// a handle keeping an older, larger size would otherwise publish it again.
    pub fn adopt_truncate(&self, fid: Fid, trunc_epoch: u64) {
        for i in self.file_inflights(fid) {
            i.trunc_epoch.fetch_max(trunc_epoch, Ordering::AcqRel);
        }
    }

    /// Changes attributes through a handle open for writing (the kernel's
    /// `ftruncate`): a size change is not checked against the mode again (permission
    /// was checked at open).
    pub async fn fsetattr(&self, creds: &Creds, f: &OpenFile, set: SetAttr) -> Result<Attr> {
        let set = SetAttr { by_writer: set.size.is_some() && (f.flags.write || f.flags.truncate), ..set };
        self.give_up_behind(f.fid);
        self.observe("setattr", Some(f.fid), set.size.unwrap_or(0), 0, self.setattr_through(creds, f, set)).await
    }

    pub async fn setxattr(&self, creds: &Creds, fid: Fid, name: &str, value: &[u8], mode: XattrMode) -> Result<()> {
        self.observe("setxattr", Some(fid), 0, value.len() as u64, async {
            refuse_unsupported_xattr(name)?;
            self.give_up_behind(fid);
            self.forget_dir(fid);
            let req =
                Request::MdsSetxattr { creds: creds.clone(), fid, name: name.to_string(), value: value.to_vec(), mode };
            self.inner.xattrless.changing();
            let r = self.md(fid, req).await;
            self.inner.xattrless.changing();
            answer!("setxattr", r?, Response::Ok => ())
        })
        .await
    }

    pub async fn getxattr(&self, creds: &Creds, fid: Fid, name: &str) -> Result<Vec<u8>> {
        refuse_unsupported_xattr(name)?;
        if !name.is_empty() && name.len() <= XATTR_NAME_MAX && self.no_xattrs_behind(fid) {
            return Err(ClientError::Errno(Errno::NoData, format!("no attribute {name}")));
        }
        let req = Request::MdsGetxattr { creds: creds.clone(), fid, name: name.to_string() };
        md_op!(self, "getxattr", fid, req, Response::Xattr(v) => v)
    }

    pub async fn listxattr(&self, creds: &Creds, fid: Fid) -> Result<Vec<String>> {
        if self.no_xattrs_behind(fid) || self.inner.xattrless.bare(fid) {
            return Ok(Vec::new());
        }
        let req = Request::MdsListxattr { creds: creds.clone(), fid };
        md_op!(self, "listxattr", fid, req, Response::XattrNames(v) => v)
    }

    pub async fn removexattr(&self, creds: &Creds, fid: Fid, name: &str) -> Result<()> {
        self.observe("removexattr", Some(fid), 0, 0, async {
            refuse_unsupported_xattr(name)?;
            self.give_up_behind(fid);
            self.forget_dir(fid);
            let req = Request::MdsRemovexattr { creds: creds.clone(), fid, name: name.to_string() };
            self.inner.xattrless.changing();
            let r = self.md(fid, req).await;
            self.inner.xattrless.changing();
            answer!("removexattr", r?, Response::Ok => ())
        })
        .await
    }

    pub async fn set_dir_layout(&self, creds: &Creds, fid: Fid, spec: Option<LayoutSpec>) -> Result<()> {
        self.observe("setstripe", Some(fid), 0, 0, async {
            if let Some(s) = &spec {
                s.validate()?;
            }
            let req = Request::MdsSetDirLayout { creds: creds.clone(), fid, spec };
            answer!("setstripe", self.md(fid, req).await?, Response::Ok => ())
        })
        .await
    }

    pub async fn get_dir_layout(&self, fid: Fid) -> Result<Option<LayoutSpec>> {
        md_op!(self, "getstripe", fid, Request::MdsGetDirLayout { fid }, Response::DirLayout(s) => s)
    }

    /// A directory's attributes as this client's own create, unlink or rmdir in it
    /// left them, if that was less than `max_age` ago and nothing this client did since
    /// changed them otherwise. The mount answers the kernel's re-read of the parent
    /// after each create or unlink from here (within its attribute cache time, which
    /// bounds how stale an answer can be, as for any cached attribute).
    /// A striped directory's: summed over its shards' (see [`striped`]), when this
    /// client holds recent attributes of every shard.
    pub fn recent_dir_attr(&self, fid: Fid, max_age: Duration) -> Option<(Attr, Duration)> {
        let dirs = self.inner.recent_dirs.lock().expect("recent dirs");
        let recent = |f: Fid| {
            let (a, at) = dirs.get(&f)?;
            let age = at.elapsed();
            (age < max_age).then(|| (a.clone(), max_age - age))
        };
        let (attr, ttl) = recent(fid)?;
        match attr.stripes.clone().filter(|s| s.master() == fid) {
            None => Some((attr, ttl)),
            Some(s) => {
                let mut shards = Vec::with_capacity(s.shards.len() - 1);
                let mut ttl = ttl;
                for &f in s.shards.iter().skip(1) {
                    let (a, t) = recent(f)?;
                    ttl = ttl.min(t);
                    shards.push(a);
                }
                Some((striped::merge_dir_attr(attr, &shards), ttl))
            }
        }
    }

    pub(crate) fn note_dir(&self, attr: Attr) {
        let mut dirs = self.inner.recent_dirs.lock().expect("recent dirs");
        if dirs.len() >= RECENT_DIRS_MAX {
            dirs.clear();
        }
        dirs.insert(attr.fid, (attr, Instant::now()));
    }

    /// A create or unlink answered here changed directory `fid` at `now`: what
    /// [`Client::recent_dir_attr`] knows of it takes that time, and keeps its age.
    /// Whether it knew the directory, as it was less than `max_age` ago.
    fn touch_recent_dir(&self, fid: Fid, now: Timespec, max_age: Duration) -> bool {
        let mut dirs = self.inner.recent_dirs.lock().expect("recent dirs");
        let Some((a, _)) = dirs.get_mut(&fid).filter(|(_, at)| at.elapsed() < max_age) else { return false };
        a.mtime = a.mtime.max(now);
        a.ctime = a.ctime.max(now);
        true
    }

    /// Drops what [`Client::recent_dir_attr`] knows of `fid` (this client changed
    /// it), and its create template, which it returns.
    fn forget_dir(&self, fid: Fid) -> Option<async_create::Template> {
        self.inner.recent_dirs.lock().expect("recent dirs").remove(&fid);
        self.inner.creates.forget(fid)
    }
}

/// The MDS keeps `user.`, `trusted.` and `security.` attributes only, and refuses
/// every other namespace with `EOPNOTSUPP`: so does this client, without asking.
/// `cp -a`, `tar --xattrs` and `rsync -A` ask for `system.posix_acl_access` and
/// `system.posix_acl_default` of every file they copy (four round trips a file).
fn refuse_unsupported_xattr(name: &str) -> Result<()> {
    let kept = ["user.", "trusted.", "security."].iter().any(|ns| name.starts_with(ns));
    if kept || name.is_empty() || name.len() > XATTR_NAME_MAX {
        // The MDS's answer (a length it refuses is ERANGE there).
        return Ok(());
    }
    Err(ClientError::Errno(
        Errno::NotSup,
        format!("unsupported xattr namespace in {name:?} (user., trusted., security.)"),
    ))
}

/// When an open was sent: this client's write clock (bytes that came with the open
/// predate a write on its way then) and the xattr epoch (see [`crate::xattrless`]).
#[derive(Clone, Copy)]
pub(crate) struct OpenSent {
    writes: u64,
    xattrs: crate::xattrless::Sent,
}
