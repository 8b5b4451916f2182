//! The object I/O layer: where each byte range of a file lives, and how one piece of it
//! is moved. The only place in the client that names an OST request.
//!
//! Above this module everything speaks file offsets; below it, one target's RPCs.
//! [`extents`] cuts a byte range of a file by the layout into [`Extent`]s (one RPC
//! each), [`objects`] lists every object of a file (for truncates and glimpses), and
//! [`ObjectIo`] performs one operation on one target. The data path in `io` and the
//! client's `fsync` reach the OSTs only through here, so each capability that changes
//! where bytes live, or how they are read, plugs in at one point:
//! - PFL instantiation: [`extents`] refuses a range reaching a component without
//!   objects (`LayoutError::NotInstantiated`); a writer has the MDS instantiate it
//!   first (`Client::instantiate`) and takes the layout of the new generation through
//!   `OpenFile::replace_layout`; a reader reads such a component as a hole
//!   ([`extents_to_read`]).
//! - DoM: a [`Target::Mdt`] for a Data-on-MDT component, chosen in [`extents`] and
//!   served in [`ObjectIo`] by the MDT of the file, which keeps the bytes in its
//!   database and answers the same operations as an OST.
//! - Mirrors: [`extents`] picks one mirror's object for a read and every mirror's for
//!   a write.
//! - The SSD cache: wraps [`ObjectIo::read`].
//! - Short-circuit local I/O: [`ObjectIo`] reads and writes an OST object through a
//!   descriptor the OSS handed over when the OSS is on this machine (see
//!   [`crate::short_circuit`]); everything else still goes as a request.
//!
//! A target's connection is resolved before the task of its piece is spawned, so all
//! pieces of a request leave at once; the in-flight bound of the RPC layer keeps the
//! pressure on each target bounded.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use layout::{Component, Layout};
use proto::msg::{Request, Response};
use proto::{Errno, Fid, ObjectId};
use rpc::RpcClient;
use tokio::task::JoinSet;

use crate::{Client, ClientError, Result, RpcCounters};
use proto::msg::DOM_WRITE_MAX;

/// Where a piece of a file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// An object on an OST. The variant to come: a mirror's object (an OST object with
    /// the mirror's component id).
    Ost { ost: u32, object: ObjectId },
    /// The Data-on-MDT component of file `fid`, kept by the file's MDT.
    Mdt { fid: Fid },
}

/// One piece of a byte range: bytes contiguous in one target, possibly gathered from
/// several places of the request (consecutive stripe units of one object are
/// `stripe_size * stripe_count` apart in the file but adjacent in the object). One
/// extent is one RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub target: Target,
    /// Where the extent starts in its target.
    pub object_offset: u64,
    pub len: u64,
    /// `(offset from the start of the request, length)`, in object order: the file
    /// offset of each is the request's offset plus the first.
    pub spans: Vec<(u64, u64)>,
}

/// The extents of `[offset, offset+len)` of file `fid` under `layout`, each at most
/// `max_rpc_bytes` long.
pub fn extents(fid: Fid, layout: &Layout, offset: u64, len: u64, max_rpc_bytes: u64) -> Result<Vec<Extent>> {
    let runs = layout.object_extents(offset, len, max_rpc_bytes)?;
    Ok(runs.into_iter().map(|run| extent(fid, layout, run)).collect())
}

/// As [`extents`], leaving out what lies in components not instantiated (and past
/// the last component): holes, which read as zeros.
pub fn extents_to_read(fid: Fid, layout: &Layout, offset: u64, len: u64, max_rpc_bytes: u64) -> Result<Vec<Extent>> {
    let runs = layout.object_extents_skipping_holes(offset, len, max_rpc_bytes)?;
    Ok(runs.into_iter().map(|run| extent(fid, layout, run)).collect())
}

/// Where `run` of file `fid` lies: an OST object (named by the layout's objects
/// FID, see [`ObjectId::of`]) or the file's DoM component on its MDT.
fn extent(fid: Fid, layout: &Layout, run: layout::ObjectExtent) -> Extent {
    let target = match run.ost {
        Some(ost) => Target::Ost { ost, object: ObjectId::of(fid, layout, run.component_id, run.stripe) },
        None => Target::Mdt { fid },
    };
    Extent { target, object_offset: run.object_offset, len: run.len, spans: run.pieces }
}

/// One object of a file, with the component that maps it (for the size arithmetic).
pub struct FileObject<'a> {
    pub target: Target,
    component: &'a Component,
    stripe: u32,
}

impl FileObject<'_> {
    /// How long this object is in a file of `file_size` bytes.
    pub fn size_for_file_size(&self, file_size: u64) -> u64 {
        self.component.object_size_for_file_size(self.stripe, file_size)
    }

    /// The file size that this object being `object_size` bytes long implies.
    pub fn file_size_from(&self, object_size: u64) -> u64 {
        self.component.file_size_from_object(self.stripe, object_size)
    }
}

/// Every object of file `fid` under `layout`: the DoM component's, then each OST
/// object (none for a component not instantiated).
pub fn objects(fid: Fid, layout: &Layout) -> impl Iterator<Item = FileObject<'_>> {
    let dom = layout.components.first().filter(|c| c.is_dom());
    let dom = dom.map(|comp| FileObject { target: Target::Mdt { fid }, component: comp, stripe: 0 });
    dom.into_iter().chain(layout.components.iter().flat_map(move |comp| {
        comp.osts.iter().enumerate().map(move |(stripe, &ost)| FileObject {
            target: Target::Ost { ost, object: ObjectId::of(fid, layout, comp.id, stripe as u32) },
            component: comp,
            stripe: stripe as u32,
        })
    }))
}

/// I/O on one target, its connection resolved: what the task of one piece holds.
pub struct ObjectIo {
    target: Target,
    rpc: Arc<RpcClient>,
    counts: Arc<RpcCounters>,
    /// Moved by every write (see [`crate::statahead`]).
    statahead: Arc<crate::statahead::Statahead>,
    /// The client's limit on OST bytes per second, if any (`-o ost_limit`).
    throttle: Option<Arc<crate::throttle::Throttle>>,
    /// The connection to the OST's local socket, when its OSS is on this machine and
    /// short-circuit I/O is on.
    local: Option<Arc<crate::short_circuit::OstSession>>,
}

/// An object reached through a short-circuit session: its descriptor, `None` if it
/// does not exist.
struct LocalObject<'a> {
    session: &'a Arc<crate::short_circuit::OstSession>,
    object: ObjectId,
    file: Option<Arc<std::fs::File>>,
}

impl Client {
    /// The I/O handle of `target`; refreshes the configuration when the target is not
    /// known yet (e.g. an OST added since we connected).
    pub(crate) async fn object_io(&self, target: Target) -> Result<ObjectIo> {
        let rpc = match target {
            Target::Ost { ost, .. } => self.ost(ost).await?,
            Target::Mdt { fid } => self.mdt(fid).await?,
        };
        let throttle = match target {
            Target::Ost { .. } => self.inner.ost_throttle.clone(),
            Target::Mdt { .. } => None,
        };
        let statahead = self.inner.statahead.clone();
        let local = match (target, &self.inner.local_osts) {
            (Target::Ost { ost, .. }, Some(local)) => local.session(ost, || {
                let config = self.inner.config.read().expect("config");
                config.target(proto::msg::TargetKind::Ost, ost).map(|t| t.uuid.clone())
            }),
            _ => None,
        };
        Ok(ObjectIo { target, rpc, counts: self.inner.rpcs.clone(), statahead, throttle, local })
    }
}

impl ObjectIo {
    /// Sends one request to the target, counted.
    async fn call(&self, req: &Request, payload: Vec<Bytes>) -> Result<rpc::Reply> {
        self.counts.count(&self.target);
        if !crate::statahead::changes_nothing(req) {
            self.statahead.changed();
        }
        Ok(self.rpc.call(req, payload).await?)
    }

    /// The descriptor of this target's object, for I/O of `len` bytes (made if
    /// `create`; a `file` of `None` when it does not exist): `None` unless
    /// short-circuit I/O is on for its OST and the OSS answered, and the I/O then goes
    /// as a request.
    async fn local_file(&self, create: bool, len: u64) -> Option<LocalObject<'_>> {
        let (Some(session), Target::Ost { object, .. }) = (&self.local, self.target) else { return None };
        let file = session.file(object, create).await?;
        if let Some(t) = &self.throttle {
            t.pass(len).await;
        }
        self.counts.count_local();
        Some(LocalObject { session, object, file })
    }

    /// The descriptor of this target's object for a read of `len` bytes that this
    /// client will not make itself (see `io::local_ranges`): `Some(None)` if the
    /// object does not exist, `None` if short-circuit I/O does not reach it.
    pub(crate) async fn local_descriptor(&self, len: u64) -> Option<Option<Arc<std::fs::File>>> {
        self.local_file(false, len).await.map(|l| l.file)
    }

    /// Reads `len` bytes at `offset`; fewer come back when the target is shorter. The
    /// flag says they were read through a local descriptor (short-circuit I/O), so
    /// the kernel's page cache holds them.
    pub async fn read(&self, offset: u64, len: u64) -> Result<(Bytes, bool)> {
        if let Some(LocalObject { session, object, file }) = self.local_file(false, len).await {
            let data = match file {
                Some(f) => session.read(f, object, offset, len).await?,
                // No object: a hole.
                None => Bytes::new(),
            };
            return Ok((data, true));
        }
        let req = match self.target {
            Target::Ost { ost, object } => Request::OstRead { ost, object, offset, len: len as u32 },
            Target::Mdt { fid } => Request::MdsDomRead { fid, offset, len: len as u32 },
        };
        let reply = self.call(&req, vec![]).await?;
        if let Some(t) = &self.throttle {
            t.pass(reply.payload.len() as u64).await;
        }
        match reply.response {
            Response::Data => Ok((reply.payload, false)),
            r => Err(ClientError::Errno(Errno::Io, format!("odd read answer: {r:?}"))),
        }
    }

    /// Writes the `len` bytes of `payload` at `offset`: to an OST as they are (no
    /// copy), to the MDT inline, in requests of at most [`DOM_WRITE_MAX`] bytes. For
    /// the MDT, `publish` (the writer's truncate epoch) has the size published with
    /// the bytes. Returns whether it was: never for an OST.
    pub async fn write(&self, offset: u64, payload: Vec<Bytes>, len: u64, publish: Option<u64>) -> Result<bool> {
        match self.target {
            Target::Ost { ost, object } => {
                if let Some(LocalObject { session, object, file: Some(file) }) = self.local_file(true, len).await {
                    self.statahead.changed();
                    session.write(file, object, offset, payload).await?;
                    return Ok(false);
                }
                if let Some(t) = &self.throttle {
                    t.pass(len).await;
                }
                let req = Request::OstWrite { ost, object, offset, sync: false };
                match self.call(&req, payload).await?.response {
                    Response::Written { bytes } if bytes == len => Ok(false),
                    r => Err(ClientError::Errno(Errno::Io, format!("short or odd write answer from OST {ost}: {r:?}"))),
                }
            }
            Target::Mdt { fid } => {
                let mut all = Vec::with_capacity(payload.iter().map(|b| b.len()).sum());
                payload.iter().for_each(|b| all.extend_from_slice(b));
                let mut at = 0u64;
                let mut published = true;
                // One request takes the bytes as they are (a small file's write).
                let pieces: Vec<Vec<u8>> = if all.len() <= DOM_WRITE_MAX as usize {
                    vec![all]
                } else {
                    all.chunks(DOM_WRITE_MAX as usize).map(<[u8]>::to_vec).collect()
                };
                for data in pieces {
                    let n = data.len() as u64;
                    let req = Request::MdsDomWrite { fid, offset: offset + at, data, publish };
                    match self.call(&req, vec![]).await?.response {
                        Response::DomWritten { bytes, size_published } if bytes == n => {
                            published &= size_published;
                            at += n;
                        }
                        Response::Error(e) => return Err(ClientError::Errno(e.code, e.message)),
                        r => return Err(ClientError::Errno(Errno::Io, format!("odd DoM write answer: {r:?}"))),
                    }
                }
                Ok(published && publish.is_some())
            }
        }
    }

    /// Deallocates `[offset, offset+len)` of the target (reads back as zeros).
    pub async fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let req = match self.target {
            Target::Ost { ost, object } => Request::OstTrim { ost, object, offset, len },
            Target::Mdt { fid } => Request::MdsDomTrim { fid, offset, len },
        };
        self.call(&req, vec![]).await?;
        Ok(())
    }

    /// Cuts the target to at most `size` bytes.
    pub async fn cut(&self, size: u64) -> Result<()> {
        let req = match self.target {
            Target::Ost { ost, object } => Request::OstPunch { ost, object, size },
            Target::Mdt { fid } => Request::MdsDomPunch { fid, size },
        };
        self.call(&req, vec![]).await?;
        Ok(())
    }

    /// Destroys an OST object no layout names (a copy abandoned by `migrate`). A
    /// Data-on-MDT target has nothing to destroy apart from its file.
    pub async fn destroy(&self) -> Result<()> {
        if let Target::Ost { ost, object } = self.target {
            self.call(&Request::OstDestroy { ost, object }, vec![]).await?;
        }
        Ok(())
    }

    /// How many bytes the target holds (its end, holes included).
    pub async fn size(&self) -> Result<u64> {
        let req = match self.target {
            Target::Ost { ost, object } => Request::OstGetattr { ost, object },
            Target::Mdt { fid } => Request::MdsDomGetattr { fid },
        };
        match self.call(&req, vec![]).await?.response {
            Response::ObjectAttr { size, .. } => Ok(size),
            r => Err(ClientError::Errno(Errno::Io, format!("odd getattr answer: {r:?}"))),
        }
    }
}

/// Makes the writes to `targets` durable: one request per OST, all OSTs at once.
pub(crate) async fn sync(c: &Client, targets: &[Target]) -> Result<()> {
    let mut by_ost: HashMap<u32, Vec<ObjectId>> = HashMap::new();
    let mut mdts: HashMap<u32, Fid> = HashMap::new();
    for target in targets {
        match *target {
            Target::Ost { ost, object } => by_ost.entry(ost).or_default().push(object),
            // DoM bytes are durable with the MDT's journal.
            Target::Mdt { fid } => {
                mdts.insert(fid.mdt(), fid);
            }
        }
    }
    let mut set = JoinSet::new();
    for (_, fid) in mdts {
        let rpc = c.mdt(fid).await?;
        c.inner.rpcs.count(&Target::Mdt { fid });
        set.spawn(rpc::stats::in_current_job(async move {
            rpc.call(&Request::MdsSync { fid }, vec![]).await.map_err(ClientError::from)
        }));
    }
    for (ost, objects) in by_ost {
        let rpc = c.ost(ost).await?;
        c.inner.rpcs.count(&Target::Ost { ost, object: objects[0] });
        set.spawn(rpc::stats::in_current_job(async move {
            rpc.call(&Request::OstSync { ost, objects }, vec![]).await.map_err(ClientError::from)
        }));
    }
    join_all(set).await.map(|_| ())
}

/// Waits for every task of `set`, in the order they finish; the first failure is the
/// answer (the rest are dropped with the set).
pub(crate) async fn join_all<T: 'static>(mut set: JoinSet<Result<T>>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(set.len());
    while let Some(r) = set.join_next().await {
        out.push(r.map_err(join_err)??);
    }
    Ok(out)
}

pub(crate) fn join_err(e: tokio::task::JoinError) -> ClientError {
    ClientError::Errno(Errno::Io, format!("I/O task failed: {e}"))
}

#[cfg(test)]
mod tests {
    use layout::{Component, Layout, Pattern, EOF};

    use super::*;

    fn two_stripes() -> Layout {
        let comp = Component {
            id: 1,
            extent_start: 0,
            extent_end: EOF,
            pattern: Pattern::Raid0,
            stripe_size: 64 << 10,
            osts: vec![3, 1],
            stripe_count_wanted: 2,
            pool: None,
            mirror: 0,
            flags: 0,
        };
        Layout { generation: 0, components: vec![comp], objects: None }
    }

    fn ost_object(fid: Fid, ost: u32, stripe: u32) -> Target {
        Target::Ost { ost, object: ObjectId { fid, component: 1, stripe } }
    }

    #[test]
    fn a_range_over_three_stripe_units_is_one_extent_per_object() {
        let fid = Fid::new(1, 2, 0);
        let s = 64 << 10;
        // Units 0 (stripe 0), 1 (stripe 1) and 2 (stripe 0 again, adjacent in its object).
        let e = extents(fid, &two_stripes(), 1000, 3 * s - 1000, 4 << 20).expect("extents");
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(e[0].target, ost_object(fid, 3, 0));
        assert_eq!((e[0].object_offset, e[0].len), (1000, 2 * s - 1000));
        assert_eq!(e[0].spans, vec![(0, s - 1000), (2 * s - 1000, s)]);
        assert_eq!(e[1].target, ost_object(fid, 1, 1));
        assert_eq!((e[1].object_offset, e[1].len), (0, s));
        assert_eq!(e[1].spans, vec![(s - 1000, s)]);
        // The RPC bound cuts an extent, never crosses objects.
        let cut = extents(fid, &two_stripes(), 0, 3 * s, s / 2).expect("extents");
        assert!(cut.iter().all(|x| x.len <= s / 2));
        assert_eq!(cut.iter().map(|x| x.len).sum::<u64>(), 3 * s);
    }

    #[test]
    fn every_object_of_a_file_is_listed_with_its_size_arithmetic() {
        let fid = Fid::new(1, 2, 0);
        let layout = two_stripes();
        let objs: Vec<FileObject> = objects(fid, &layout).collect();
        let targets: Vec<Target> = objs.iter().map(|o| o.target).collect();
        assert_eq!(targets, vec![ost_object(fid, 3, 0), ost_object(fid, 1, 1)]);
        let s = 64 << 10;
        // A file of 1.5 units: all of unit 0 on stripe 0, half a unit on stripe 1.
        assert_eq!(objs[0].size_for_file_size(s + s / 2), s);
        assert_eq!(objs[1].size_for_file_size(s + s / 2), s / 2);
        assert_eq!(objs[1].file_size_from(s / 2), s + s / 2);
        let empty = Layout {
            generation: 0,
            components: vec![Component { osts: vec![], ..two_stripes().components[0].clone() }],
            objects: None,
        };
        assert_eq!(objects(fid, &empty).count(), 0, "a component not instantiated has no objects");
    }
}
