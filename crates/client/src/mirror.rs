//! File-level mirrors (FLR, Lustre's `lfs mirror`): a file whose layout holds
//! several copies of its bytes, each a run of components with a mirror id.
//!
//! - A read goes to one mirror in sync over its range, `prefer` mirrors first; a
//!   mirror with an OST known down (the configuration says so, or a read there failed
//!   lately) is tried last, and a read that fails or stalls on one mirror is tried on
//!   the next, so a mirrored file stays readable with an OST stopped.
//! - A write goes to one mirror. Before its first byte leaves, the MDS marks the
//!   other mirrors' components over the range stale (`LayoutChange::WriteIntent`,
//!   journaled before it is answered), so no reader takes an old copy for the file.
//! - `extend`, `resync` and `split` make a new layout client-side and have the MDS
//!   swap it in (`Request::MdsReplaceLayout`), as `braid migrate` does: the bytes of
//!   a new mirror, or of fresh components in place of stale ones, are copied while
//!   the file's data version stays put, and the MDS checks that it did, that no
//!   other client holds the file open, and that every byte keeps an in-sync copy.
//!   A copy that fails or is refused leaves the file as it was (its objects are
//!   destroyed again), so each command can be run again.
//! - `verify` reads every in-sync mirror and compares them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use layout::{Component, Layout, LayoutChange, LayoutSpec};
use proto::msg::{Attr, Creds, FileKind, OpenFlags};
use proto::Errno;

use crate::*;

/// How long a read waits on one mirror before it tries the next, while there is
/// one (a stopped OST is otherwise retried for the recovery timeout).
const MIRROR_TRY: Duration = Duration::from_secs(3);
/// How long an OST a mirrored read failed on is tried last.
const FAILED_MEMORY: Duration = Duration::from_secs(30);
/// Bytes compared per read of `verify`.
const VERIFY_CHUNK: u64 = 4 << 20;
/// Most mirrors of one file (Lustre's limit is 16 too).
pub const MIRRORS_MAX: usize = 16;

/// OSTs mirrored reads failed on lately.
#[derive(Default)]
pub(crate) struct FailedOsts(Mutex<HashMap<u32, Instant>>);

impl FailedOsts {
    fn note(&self, osts: impl IntoIterator<Item = u32>) {
        let mut m = self.0.lock().expect("failed osts");
        m.retain(|_, at| at.elapsed() < FAILED_MEMORY);
        let now = Instant::now();
        for o in osts {
            m.insert(o, now);
        }
    }

    fn recent(&self, ost: u32) -> bool {
        self.0.lock().expect("failed osts").get(&ost).is_some_and(|at| at.elapsed() < FAILED_MEMORY)
    }
}

/// One mirror a command adds: its layout and whether reads prefer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSpec {
    pub layout: LayoutSpec,
    pub prefer: bool,
}

/// What `verify` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// The in-sync mirrors compared.
    pub mirrors: Vec<u16>,
    pub bytes: u64,
    /// `(offset, mirror a, mirror b)` of the first byte each pair differs at, per chunk.
    pub differences: Vec<(u64, u16, u16)>,
}

impl Client {
    /// The OSTs of mirror `m`'s components over `[start, end)`.
    fn mirror_osts(layout: &Layout, m: u16, start: u64, end: u64) -> Vec<u32> {
        let over = layout.components.iter().filter(|c| c.mirror == m && c.overlaps(start, end));
        over.flat_map(|c| c.osts.iter().copied()).collect()
    }

    /// Whether an OST is known down: the configuration says so, or a mirrored read
    /// failed there lately.
    fn ost_known_down(&self, ost: u32) -> bool {
        let down = self.inner.config.read().expect("config").osts.iter().any(|t| t.index == ost && !t.up);
        down || self.inner.failed_osts.recent(ost)
    }

    /// `[offset, offset+len)` of a mirrored file: from the first mirror in sync over
    /// the range that answers (see the module's notes).
    pub(crate) async fn read_mirrored(
        &self,
        fid: Fid,
        layout: &Layout,
        offset: u64,
        len: u64,
    ) -> Result<(Bytes, bool)> {
        let end = offset.saturating_add(len);
        let mut order = layout.read_order(offset, end);
        if order.is_empty() {
            return Err(ClientError::Errno(
                Errno::Io,
                format!("{fid}: no mirror is in sync over [{offset}, {end}) (run braid mirror resync)"),
            ));
        }
        // Stable: preference and id order stay among the mirrors up.
        order.sort_by_key(|&m| Client::mirror_osts(layout, m, offset, end).into_iter().any(|o| self.ost_known_down(o)));
        let mut last = None;
        for (i, &m) in order.iter().enumerate() {
            let view = layout.mirror(m);
            let read = io::read_extents_of(self, fid, &view, offset, len);
            let r = match i + 1 < order.len() {
                true => tokio::time::timeout(MIRROR_TRY, read).await.unwrap_or_else(|_| {
                    Err(ClientError::Errno(Errno::Io, format!("mirror {m} did not answer in {MIRROR_TRY:?}")))
                }),
                false => read.await,
            };
            match r {
                Ok(data) => return Ok(data),
                Err(e) => {
                    tracing::debug!(%fid, mirror = m, error = %e, "a mirror's read failed, trying the next");
                    self.inner.failed_osts.note(Client::mirror_osts(layout, m, offset, end));
                    last = Some(e);
                }
            }
        }
        Err(last.expect("at least one mirror was tried"))
    }

    /// The mirror a write of `[start, end)` through `f` goes to, as a layout of its
    /// own: the first in sync over the range with its OSTs up, the others marked
    /// stale over the range first (by the MDS, unless they already are).
    pub(crate) async fn write_mirror(
        &self,
        f: &OpenFile,
        layout: Arc<Layout>,
        start: u64,
        end: u64,
    ) -> Result<Arc<Layout>> {
        let mut layout = layout;
        for _ in 0..2 {
            let mut order = layout.read_order(start, end);
            order.sort_by_key(|&m| {
                Client::mirror_osts(&layout, m, start, end).into_iter().any(|o| self.ost_known_down(o))
            });
            let Some(&m) = order.first() else {
                return Err(ClientError::Errno(
                    Errno::Io,
                    format!("{}: no mirror is in sync over [{start}, {end})", f.fid),
                ));
            };
            if layout.others_stale_over(m, start, end) {
                return Ok(Arc::new(layout.mirror(m)));
            }
            let change = LayoutChange::WriteIntent { mirror: m, start, end };
            match self.change_layout(&f.creds, f.fid, change).await {
                Ok(attr) => {
                    let fresh = attr
                        .layout
                        .ok_or_else(|| ClientError::Errno(Errno::Io, format!("{} lost its layout", f.fid)))?;
                    f.replace_layout(fresh.clone());
                    return Ok(Arc::new(fresh.mirror(m)));
                }
                // Another writer made that mirror stale: its layout says which is not.
                Err(e) if e.errno() == Errno::Stale => {
                    if let Some(fresh) = self.getattr(f.fid).await?.layout {
                        f.replace_layout(fresh);
                    }
                    layout = f.layout();
                }
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::Errno(Errno::Again, format!("{}: its mirrors kept changing under the write", f.fid)))
    }

    /// Opens `name` in `parent` to read, for a mirror command: the handle, its
    /// attributes and layout.
    async fn open_for_mirror(&self, creds: &Creds, parent: Fid, name: &str) -> Result<(OpenFile, Attr, Layout)> {
        let fid = self.lookup(creds, parent, name).await?.fid;
        let read = OpenFlags { read: true, write: false, truncate: false };
        let (f, attr) = self.open(creds, fid, read).await?;
        if attr.kind != FileKind::File {
            let _ = self.close(f).await;
            return Err(ClientError::Errno(Errno::IsDir, format!("{name} is not a regular file")));
        }
        let Some(layout) = attr.layout.clone() else {
            let _ = self.close(f).await;
            return Err(ClientError::Errno(Errno::Inval, format!("{name} has no layout")));
        };
        Ok((f, attr, layout))
    }

    /// Runs `op` on `name` opened to read, and closes it.
    async fn with_mirror_file<T>(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        op: impl AsyncFnOnce(&Attr, &Layout) -> Result<T>,
    ) -> Result<T> {
        let (f, attr, layout) = self.open_for_mirror(creds, parent, name).await?;
        let r = op(&attr, &layout).await;
        let _ = self.close(f).await;
        r
    }

    /// `braid mirror create`: a new, empty file `name` in `parent` (`mode`) with a
    /// mirror per spec, the first its layout as created.
    pub async fn mirror_create(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        specs: &[MirrorSpec],
    ) -> Result<Attr> {
        self.observe("mirror", Some(parent), 0, 0, async {
            let Some(first) = specs.first() else {
                return Err(ClientError::Errno(Errno::Inval, "a mirrored file needs at least one mirror".into()));
            };
            if specs.len() > MIRRORS_MAX {
                return Err(ClientError::Errno(Errno::Inval, format!("{} mirrors (1 to {MIRRORS_MAX})", specs.len())));
            }
            for s in specs {
                s.layout.validate()?;
                if s.layout.components.iter().any(|c| c.pattern == layout::Pattern::Mdt) {
                    return Err(ClientError::Errno(Errno::NotSup, "a mirror with a Data-on-MDT component".into()));
                }
            }
            let flags = OpenFlags { read: false, write: true, truncate: false };
            let (f, _, _) = self.create(creds, parent, name, mode, true, flags, Some(first.layout.clone())).await?;
            self.close(f).await?;
            self.add_mirrors(creds, parent, name, &specs[1..], first.prefer).await
        })
        .await
    }

    /// `braid mirror extend`: adds a mirror per spec to file `name` in `parent`, each
    /// a copy of its bytes. A file without mirrors becomes mirror 1.
    pub async fn mirror_extend(&self, creds: &Creds, parent: Fid, name: &str, specs: &[MirrorSpec]) -> Result<Attr> {
        self.observe("mirror", Some(parent), 0, 0, async {
            if specs.is_empty() {
                return Err(ClientError::Errno(Errno::Inval, "no mirror to add".into()));
            }
            self.add_mirrors(creds, parent, name, specs, false).await
        })
        .await
    }

    /// Adds a mirror per spec (see [`Client::mirror_extend`]); with `first_prefer`,
    /// reads prefer the file's first mirror.
    async fn add_mirrors(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        specs: &[MirrorSpec],
        first_prefer: bool,
    ) -> Result<Attr> {
        self.with_mirror_file(creds, parent, name, async |attr, old| {
                if old.dom_end().is_some() {
                    return Err(ClientError::Errno(
                        Errno::NotSup,
                        format!("{name} has a Data-on-MDT component: a mirrored file keeps its bytes on OSTs (braid migrate it first)"),
                    ));
                }
                if old.mirror_count() + specs.len() > MIRRORS_MAX {
                    return Err(ClientError::Errno(
                        Errno::Inval,
                        format!("{name} would have {} mirrors (1 to {MIRRORS_MAX})", old.mirror_count() + specs.len()),
                    ));
                }
                let mut new = old.clone();
                if !new.is_mirrored() {
                    for c in &mut new.components {
                        c.mirror = 1;
                    }
                }
                if first_prefer {
                    let first = new.components[0].mirror;
                    for c in new.components.iter_mut().filter(|c| c.mirror == first) {
                        c.flags |= Component::PREFER;
                    }
                }
                let mut added = Vec::new();
                let mut next_id = old.next_component_id();
                for s in specs {
                    let m = new.components.iter().map(|c| c.mirror).max().unwrap_or(0) + 1;
                    // Lustre numbers a mirror's components `mirror << 16 | n`, n
                    // counting on over the mirrors; an id the file used is never reused.
                    let lustre_id = (u32::from(m) << 16) | (new.components.len() as u32 + 1);
                    let first_id = next_id.max(lustre_id);
                    let cursor = u64::from(attr.fid.oid) + u64::from(m);
                    let mirror = self.placed_apart(&new, &s.layout, attr.size, (first_id, cursor), m, s.prefer)?;
                    next_id = mirror.next_component_id();
                    new.components.extend(mirror.components.iter().cloned());
                    added.push(mirror);
                }
                new.validate()?;
                self.copy_and_replace(creds, attr, old, new, &added).await
            })
            .await
    }

    /// `braid mirror resync`: the stale components of file `name` in `parent` are
    /// replaced by fresh ones holding a copy of the in-sync bytes (new objects, the
    /// old ones destroyed with the switch, so a resync cut short changes nothing).
    /// Returns the attributes, unchanged if nothing was stale.
    pub async fn mirror_resync(&self, creds: &Creds, parent: Fid, name: &str) -> Result<Attr> {
        self.observe("mirror", Some(parent), 0, 0, async {
            self.with_mirror_file(creds, parent, name, async |attr, old| {
                if !old.components.iter().any(Component::is_stale) {
                    return Ok(attr.clone());
                }
                let size = attr.size;
                let mut new = old.clone();
                let mut fresh = Vec::new();
                let mut next_id = old.next_component_id();
                let osts = self.config().ost_states();
                for i in 0..new.components.len() {
                    let c = &new.components[i];
                    if !c.is_stale() {
                        continue;
                    }
                    if c.extent_start < size && old.read_order(c.extent_start, c.extent_end.min(size)).is_empty() {
                        return Err(ClientError::Errno(
                            Errno::Io,
                            format!(
                                "{name}: every mirror is stale over [{}, {}): nothing to resync from",
                                c.extent_start,
                                c.extent_end.min(size)
                            ),
                        ));
                    }
                    let mut comp = Component { id: next_id, flags: c.flags & !Component::STALE, ..c.clone() };
                    next_id += 1;
                    // Placed again where an OST of it is down, or it has none yet
                    // and holds bytes of the file.
                    let up = |o: &u32| osts.iter().any(|s| s.index == *o && s.up);
                    let place = match comp.osts.is_empty() {
                        true => comp.extent_start < size,
                        false => !comp.osts.iter().all(up),
                    };
                    if place {
                        let spec = layout::ComponentSpec {
                            extent_end: comp.extent_end,
                            stripe_count: Some(comp.stripe_count_wanted),
                            stripe_size: Some(comp.stripe_size),
                            pool: comp.pool.clone(),
                            ..Default::default()
                        };
                        let cursor = u64::from(attr.fid.oid) + u64::from(comp.mirror);
                        comp.osts = choose_apart(&spec, &osts, &others_osts(&new, &comp), cursor)?;
                    }
                    new.components[i] = comp.clone();
                    fresh.push(Layout { generation: 0, components: vec![comp], objects: new.objects });
                }
                new.validate()?;
                self.copy_and_replace(creds, attr, old, new, &fresh).await
            })
            .await
        })
        .await
    }

    /// `braid mirror split`: takes mirror `mirror` out of file `name` in `parent`.
    /// With `keep`, its bytes become a new file (a directory and a name, Lustre's
    /// `-f NEW_FILE` or `FILE.mirror~ID`) laid out as the mirror was; without, they go
    /// (`-d`). Refused for the last mirror, and by the MDS for the last in-sync copy
    /// of any byte (the new file is then removed again).
    pub async fn mirror_split(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mirror: u16,
        keep: Option<(Fid, &str)>,
    ) -> Result<Attr> {
        self.observe("mirror", Some(parent), 0, 0, async {
            self.with_mirror_file(creds, parent, name, async |attr, old| {
                if !old.is_mirrored() || !old.mirror_ids().contains(&mirror) {
                    return Err(ClientError::Errno(Errno::Inval, format!("{name} has no mirror {mirror}")));
                }
                if old.mirror_count() == 1 {
                    return Err(ClientError::Errno(Errno::Inval, format!("{name}: mirror {mirror} is its last")));
                }
                let mut new = old.clone();
                new.components.retain(|c| c.mirror != mirror);
                // One mirror left, in sync: a plain file again, as Lustre makes it. (A
                // stale one stays marked: the MDS refuses to keep only stale bytes.)
                if new.mirror_count() == 1 && !new.components.iter().any(|c| c.is_stale()) {
                    for c in &mut new.components {
                        (c.mirror, c.flags) = (0, 0);
                    }
                }
                let Some((dir, to)) = keep else { return self.replace_layout(creds, attr, &new).await };
                self.copy_mirror_to(creds, attr, &old.mirror(mirror), dir, to).await?;
                let r = self.replace_layout(creds, attr, &new).await;
                if r.is_err() {
                    let _ = self.unlink(creds, dir, to).await;
                }
                r
            })
            .await
        })
        .await
    }

    /// A new file `to` in `dir` laid out as `view` (one mirror of the file `attr`
    /// describes) holding that mirror's bytes.
    async fn copy_mirror_to(&self, creds: &Creds, attr: &Attr, view: &Layout, dir: Fid, to: &str) -> Result<()> {
        let components = view
            .components
            .iter()
            .map(|c| layout::ComponentSpec {
                extent_end: c.extent_end,
                stripe_count: Some(c.stripe_count_wanted),
                stripe_size: Some(c.stripe_size),
                pool: c.pool.clone(),
                ..Default::default()
            })
            .collect();
        let flags = OpenFlags { read: false, write: true, truncate: false };
        let spec = Some(LayoutSpec { components });
        let (f, _, _) = self.create(creds, dir, to, attr.mode & 0o7777, true, flags, spec).await?;
        let copied = async {
            let mut offset = 0;
            while offset < attr.size {
                let len = VERIFY_CHUNK.min(attr.size - offset);
                let (data, _) = io::read_extents_of(self, attr.fid, view, offset, len).await?;
                if data.iter().any(|&b| b != 0) {
                    self.write(&f, offset, data).await?;
                }
                offset += len;
            }
            // A hole at the end is part of the size too.
            if f.size() < attr.size {
                self.ftruncate(creds, &f, attr.size).await?;
            }
            self.flush(&f).await
        };
        let r = copied.await;
        let closed = self.close(f).await;
        if let Err(e) = r.and(closed) {
            let _ = self.unlink(creds, dir, to).await;
            return Err(e);
        }
        Ok(())
    }

    /// `braid mirror verify`: compares the bytes of every mirror in sync over each
    /// chunk of file `name` in `parent`.
    pub async fn mirror_verify(&self, creds: &Creds, parent: Fid, name: &str) -> Result<VerifyReport> {
        self.observe("mirror", Some(parent), 0, 0, async {
            self.with_mirror_file(creds, parent, name, async |attr, layout| {
                let mut report = VerifyReport { mirrors: layout.read_order(0, attr.size.max(1)), ..Default::default() };
                report.mirrors.sort_unstable();
                let mut offset = 0;
                while offset < attr.size {
                    let len = VERIFY_CHUNK.min(attr.size - offset);
                    let mut first: Option<(u16, Bytes)> = None;
                    for m in layout.read_order(offset, offset + len) {
                        let (data, _) = io::read_extents_of(self, attr.fid, &layout.mirror(m), offset, len).await?;
                        match &first {
                            None => first = Some((m, data)),
                            Some((a, base)) => {
                                if let Some(i) = base.iter().zip(data.iter()).position(|(x, y)| x != y) {
                                    report.differences.push((offset + i as u64, *a, m));
                                }
                            }
                        }
                    }
                    report.bytes += len;
                    offset += len;
                }
                Ok(report)
            })
            .await
        })
        .await
    }

    /// Mirror `m` made from `spec` for a file of `size` bytes: filled from the
    /// layout's first component, placed away from the OSTs of its other mirrors
    /// while enough are left, component ids from `first_id`, objects for every byte
    /// below `size`. The placement cursor is the file's own (its FID): consecutive
    /// files' mirrors spread over the pool as the MDS's round robin spreads files.
    fn placed_apart(
        &self,
        layout: &Layout,
        spec: &LayoutSpec,
        size: u64,
        (first_id, cursor): (u32, u64),
        m: u16,
        prefer: bool,
    ) -> Result<Layout> {
        spec.validate()?;
        if spec.components.iter().any(|c| c.pattern == layout::Pattern::Mdt) {
            return Err(ClientError::Errno(Errno::NotSup, "a mirror with a Data-on-MDT component".into()));
        }
        let first = &layout.components[0];
        let base = LayoutSpec::raid0(Some(first.stripe_count_wanted.max(1)), Some(first.stripe_size));
        let spec = spec.inherit(&base);
        let osts = self.config().ost_states();
        let used: Vec<u32> = layout.components.iter().flat_map(|c| c.osts.iter().copied()).collect();
        let apart: Vec<layout::OstState> = osts.iter().filter(|o| !used.contains(&o.index)).cloned().collect();
        let place =
            |e: layout::PlacementError| ClientError::Errno(Errno::Inval, format!("cannot place mirror {m}: {e}"));
        let mut new = match spec.instantiate(&apart, cursor) {
            Ok(l) => l,
            Err(_) => spec.instantiate(&osts, cursor).map_err(place)?,
        };
        for c in &mut new.components {
            c.id += first_id - 1;
            c.mirror = m;
            if prefer {
                c.flags |= Component::PREFER;
            }
        }
        if new.instantiate_below(size.min(new.end()), &apart, cursor).is_err() {
            new.instantiate_below(size.min(new.end()), &osts, cursor).map_err(place)?;
        }
        Ok(new)
    }
}

/// The OSTs of the components of other mirrors over `c`'s extent.
fn others_osts(layout: &Layout, c: &Component) -> Vec<u32> {
    let others = layout.components.iter().filter(|o| o.mirror != c.mirror && o.overlaps(c.extent_start, c.extent_end));
    others.flat_map(|o| o.osts.iter().copied()).collect()
}

/// OSTs for `spec` away from `others` while enough are left.
fn choose_apart(
    spec: &layout::ComponentSpec,
    osts: &[layout::OstState],
    others: &[u32],
    cursor: u64,
) -> Result<Vec<u32>> {
    let apart: Vec<layout::OstState> = osts.iter().filter(|o| !others.contains(&o.index)).cloned().collect();
    layout::choose_osts(spec, &apart, cursor)
        .or_else(|_| layout::choose_osts(spec, osts, cursor))
        .map_err(|e| ClientError::Errno(Errno::NoSpc, format!("cannot place a resynced component: {e}")))
}
