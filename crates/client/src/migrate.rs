//! `braid migrate`: a file's bytes moved to another layout (another pool, stripe
//! count or size) while it keeps its name, FID, attributes and open-by-name identity,
//! as Lustre's `lfs migrate`.
//!
//! Objects are named by the file's FID, a component id and a stripe, so the copy goes
//! into objects of the same file under component ids its layout does not use yet:
//! this client places the new components as the MDS would (the OSTs that are up, the
//! pools the configuration names), writes the file's bytes into them straight through
//! object I/O (no size report, no data version moved), makes them durable, and asks
//! the MDS to replace the layout ([`Request::MdsReplaceLayout`]). The MDS checks that
//! the file's data version has not moved since the copy began and that no other client
//! holds it open, swaps the layout in one journaled step and queues the old objects
//! for destruction: a writer racing the copy makes the migration fail (run it again),
//! never lose a byte; readers that open the file afterwards read the new objects.
//!
//! A file with a Data-on-MDT component is read from its MDT like any other and moves
//! onto OSTs (the MDS drops its bytes there with the switch); a layout with a DoM
//! component is not a migration's target (`setstripe` makes such files).
//!
//! If the copy fails or is refused, the objects written so far are destroyed again
//! (best effort: a client killed mid-copy leaves them behind as orphans, which no
//! layout names). Chunks of zeros are not written, so holes stay holes (and zeros
//! written as data become holes, which read the same).

use std::collections::HashSet;

use layout::{Layout, LayoutSpec};
use proto::msg::{Attr, Creds, FileKind, OpenFlags, Request, Response};
use proto::Errno;

use crate::*;

/// Bytes copied per read and write.
const COPY_CHUNK: u64 = 4 << 20;
/// Chunks copied at once (each read, then written).
const COPY_IN_FLIGHT: usize = 4;
/// How long the replacement waits for other clients' closes to reach the MDS.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Client {
    /// Moves the bytes of file `name` in directory `parent` to a layout made from
    /// `spec`, whose unset fields keep the file's current stripe count and size.
    /// Returns the file's attributes with its new layout.
    pub async fn migrate(&self, creds: &Creds, parent: Fid, name: &str, spec: LayoutSpec) -> Result<Attr> {
        self.observe("migrate", Some(parent), 0, 0, async {
            spec.validate()?;
            if spec.components.iter().any(|c| c.pattern == layout::Pattern::Mdt) {
                return Err(ClientError::Errno(Errno::NotSup, "migrating to a Data-on-MDT layout".into()));
            }
            let fid = self.lookup(creds, parent, name).await?.fid;
            let read = OpenFlags { read: true, write: false, truncate: false };
            let (src, attr) = self.open(creds, fid, read).await?;
            let r = self.migrate_open(creds, name, &attr, spec).await;
            let _ = self.close(src).await;
            r
        })
        .await
    }

    async fn migrate_open(&self, creds: &Creds, name: &str, attr: &Attr, spec: LayoutSpec) -> Result<Attr> {
        if attr.kind != FileKind::File {
            return Err(ClientError::Errno(Errno::IsDir, format!("{name} is not a regular file")));
        }
        let Some(old) = attr.layout.as_ref() else {
            return Err(ClientError::Errno(Errno::Inval, format!("{name} has no layout")));
        };
        let new = self.placed_after(old, &spec, attr.size)?;
        self.copy_and_replace(creds, attr, old, new.clone(), &[new]).await
    }

    /// Copies the file's bytes into each layout of `targets` (a new mirror, a fresh
    /// component) over the extent it covers, then has the MDS swap `old` for `new`;
    /// the copies' objects are destroyed again once no layout can name them: the
    /// copy failed (nothing was asked of the MDS), or the MDS refused the
    /// replacement. One whose answer was lost (the MDS away past the timeout) may
    /// have been applied: then they are the file's, and stay.
    pub(crate) async fn copy_and_replace(
        &self,
        creds: &Creds,
        attr: &Attr,
        old: &Layout,
        new: Layout,
        targets: &[Layout],
    ) -> Result<Attr> {
        let copied = async {
            for t in targets {
                let start = t.components.first().map_or(0, |c| c.extent_start);
                let end = t.end().min(attr.size);
                self.copy_range(attr.fid, old, t, start, end).await?;
            }
            Ok::<_, ClientError>(())
        };
        let (r, unnamed) = match copied.await {
            Err(e) => (Err(e), true),
            Ok(()) => {
                let r = self.replace_layout(creds, attr, &new).await;
                let refused = matches!(&r, Err(ClientError::Rpc(proto::RpcError::Remote(_))));
                (r, refused)
            }
        };
        if unnamed {
            for t in targets {
                self.destroy_objects(attr.fid, t).await;
            }
        }
        r
    }

    /// `spec` placed as a new file's layout would be, filled from `old`'s first
    /// component on OSTs, with component ids after `old`'s and objects for every byte
    /// below `size`.
    fn placed_after(&self, old: &Layout, spec: &LayoutSpec, size: u64) -> Result<Layout> {
        let base = match old.components.iter().find(|c| !c.is_dom()) {
            Some(c) => LayoutSpec::raid0(Some(c.stripe_count_wanted.max(1)), Some(c.stripe_size)),
            None => LayoutSpec::raid0(Some(1), Some(1 << 20)),
        };
        let spec = spec.inherit(&base);
        let osts = self.config().ost_states();
        let cursor = rand_cursor();
        let place =
            |e: layout::PlacementError| ClientError::Errno(Errno::Inval, format!("cannot place the new layout: {e}"));
        let mut new = spec.instantiate(&osts, cursor).map_err(place)?;
        // Named as the old objects are: by the FID the file had, if it moved MDT.
        new.objects = old.objects;
        let after = old.next_component_id() - 1;
        for c in &mut new.components {
            c.id += after;
        }
        new.instantiate_below(size.min(new.end()), &osts, cursor).map_err(place)?;
        Ok(new)
    }

    /// Copies bytes `[start, end)` of file `fid` from `from`'s objects (any mirror in
    /// sync) to `to`'s, which has objects for all of them, and makes them durable.
    pub(crate) async fn copy_range(&self, fid: Fid, from: &Layout, to: &Layout, start: u64, end: u64) -> Result<()> {
        let (from, to) = (Arc::new(from.clone()), Arc::new(to.clone()));
        let mut touched = HashSet::new();
        // A few chunks at once, each read then written: the slower side (a cool pool's
        // bandwidth, a latency per request) always has work queued.
        let mut set = tokio::task::JoinSet::new();
        let mut offset = start;
        loop {
            while offset < end && set.len() < COPY_IN_FLIGHT {
                let len = COPY_CHUNK.min(end - offset);
                let (c, from, to) = (self.clone(), from.clone(), to.clone());
                set.spawn(rpc::stats::in_current_job(async move {
                    let (data, _) = io::read_extents(&c, fid, &from, offset, len).await?;
                    // Zeros need no writing: objects read as zeros where nothing was
                    // written, so a sparse file stays sparse.
                    match data.iter().any(|&b| b != 0) {
                        true => io::write_extents(&c, fid, &to, offset, data).await,
                        false => Ok(Vec::new()),
                    }
                }));
                offset += len;
            }
            match set.join_next().await {
                Some(r) => touched.extend(r.map_err(objio::join_err)??),
                None => break,
            }
        }
        let targets: Vec<objio::Target> = touched.into_iter().collect();
        objio::sync(self, &targets).await
    }

    /// Destroys the OST objects `layout` names (best effort): a copy no layout names.
    pub(crate) async fn destroy_objects(&self, fid: Fid, layout: &Layout) {
        for (ost, object) in crate::io::layout_objects(fid, layout) {
            if let Ok(t) = self.object_io(objio::Target::Ost { ost, object }).await {
                let _ = t.destroy().await;
            }
        }
    }

    /// Asks the MDS to give the file `new` in place of its layout, waiting a moment
    /// for other clients' closes still on their way.
    pub(crate) async fn replace_layout(&self, creds: &Creds, attr: &Attr, new: &Layout) -> Result<Attr> {
        let req = Request::MdsReplaceLayout {
            creds: creds.clone(),
            fid: attr.fid,
            layout: new.clone(),
            data_version: attr.data_version,
        };
        let deadline = tokio::time::Instant::now() + BUSY_WAIT;
        loop {
            match self.md(attr.fid, req.clone()).await {
                Ok(Response::Attr(a)) => return Ok(a),
                Ok(r) => return Err(unexpected("replace layout", &r)),
                Err(e) if e.errno() == Errno::Busy && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A placement cursor that differs between calls, as the MDS's moves per file.
fn rand_cursor() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.subsec_nanos() as u64 ^ u64::from(std::process::id())
}
