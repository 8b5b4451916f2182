//! Changes to the layout of an existing file: PFL instantiation (the components a
//! write or truncate reaches get their OSTs), `setstripe --component-add/-del`, and
//! the replacement of a file's layout that ends a `braid migrate`.
//!
//! Each change is one mutation of the batch like any other: journaled with it, so an
//! instantiation survives a crash once acknowledged and is never half done, and kept in
//! the reply cache, so a retried request gets the first answer. Two clients racing to
//! instantiate the same component are ordered by the committer: the second finds it
//! instantiated, changes nothing, and gets the layout the first made.
use layout::LayoutChange;
use proto::msg::{Creds, FileKind, Response, Timespec};
use proto::{Errno, Fid};

use super::create::misplaced_ost;
use super::error::{fail, OpError, OpResult};
use super::writer::{Placement, Writer};
use crate::inode::MAY_WRITE;

impl Writer<'_> {
    /// The inode of `fid`, a regular file (only files have layouts).
    fn file_inode(&self, fid: Fid) -> OpResult<crate::inode::Inode> {
        let ino = self.view.handle_inode(fid)?;
        if ino.attr.kind != FileKind::File {
            return fail(Errno::Inval, format!("{fid} is not a regular file: only files have layouts"));
        }
        self.view.takes_changes(&ino)?;
        Ok(ino)
    }

    pub(super) fn layout_change(
        &mut self,
        creds: &Creds,
        fid: Fid,
        change: &LayoutChange,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.file_inode(fid)?;
        // Adding or deleting components is a change of the file, as Lustre's setstripe
        // on a file: it needs write permission. An instantiation chooses OSTs and
        // changes no byte; it comes from a writer or a truncate, so it needs write
        // permission too, or the file open by this client (permission was checked at
        // open, and a mode changed since must not fail its writes), or the owner (who
        // may write a file created read-only through the descriptor that created it,
        // also after an MDS restart forgot the opens). A write intent on a mirrored
        // file comes from such a writer too, before its first write.
        let writer = ino.may(creds, MAY_WRITE)
            || matches!(change, LayoutChange::Instantiate { .. } | LayoutChange::WriteIntent { .. })
                && ((place.is_open)(fid, Some(self.client)) || ino.is_owner_or_root(creds));
        if !writer {
            return fail(Errno::Access, format!("changing the layout of {fid} needs write permission on it"));
        }
        if place.osts.is_empty() {
            return fail(Errno::Again, "the MDS has not learned the OST list from the MGS yet");
        }
        let Some(layout) = ino.attr.layout.as_mut() else {
            return fail(Errno::Inval, format!("{fid} has no layout"));
        };
        let changed = layout.apply(change, place.osts, place.cursor).map_err(|e| {
            let code = match e {
                layout::PlacementError::NoOstUp | layout::PlacementError::NoOstUpInPool(_) => Errno::NoSpc,
                layout::PlacementError::Layout(layout::LayoutError::BeyondLayout(_)) => Errno::NoData,
                // A write intent on a mirror another writer made stale: the layout
                // the client holds is old; it takes this one and writes another mirror.
                layout::PlacementError::Layout(layout::LayoutError::Mirror(_))
                    if matches!(change, LayoutChange::WriteIntent { .. }) =>
                {
                    Errno::Stale
                }
                _ => Errno::Inval,
            };
            OpError::Errno(code, format!("cannot change the layout of {fid}: {e}"))
        })?;
        if changed {
            ino.attr.ctime = now;
            ino.attr.data_version += 1;
            self.put_inode(fid, &ino)?;
        }
        Ok(Response::Attr(ino.attr))
    }
}

impl Writer<'_> {
    /// Replaces the layout of file `fid` with `layout` (see
    /// [`Request::MdsReplaceLayout`]), made by a client that wrote the bytes of its new
    /// components while the file stayed at `data_version`: a migration (every
    /// component new), or a mirror extended, resynced or split (components kept, by
    /// id, objects and extent unchanged, their mirror id and flags may change). The
    /// objects of components the new layout drops are queued for destruction as an
    /// unlinked file's are, and its bytes on this MDT (a Data-on-MDT component)
    /// dropped; the data version moves, so every cached byte of the file is dropped at
    /// its next open. The new layout has no DoM component, and keeps an in-sync copy
    /// of every byte the old one had one of.
    ///
    /// [`Request::MdsReplaceLayout`]: proto::msg::Request::MdsReplaceLayout
    pub(super) fn replace_layout(
        &mut self,
        creds: &Creds,
        fid: Fid,
        layout: &layout::Layout,
        data_version: u64,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.file_inode(fid)?;
        if !ino.may(creds, MAY_WRITE) {
            return fail(Errno::Access, format!("replacing the layout of {fid} needs write permission on it"));
        }
        let Some(old) = ino.attr.layout.clone() else {
            return fail(Errno::Inval, format!("{fid} has no layout"));
        };
        if layout.dom_end().is_some() {
            return fail(Errno::NotSup, format!("{fid}: a new layout with a Data-on-MDT component"));
        }
        if ino.attr.data_version != data_version {
            return fail(Errno::Again, format!("{fid} changed while its bytes were copied: run the command again"));
        }
        if (place.open_elsewhere)(fid, self.client) {
            return fail(Errno::Busy, format!("{fid} is open on another client: try again once it is closed"));
        }
        layout.validate().map_err(|e| OpError::Errno(Errno::Inval, format!("the new layout of {fid}: {e}")))?;
        if layout.objects != old.objects {
            return fail(
                Errno::Inval,
                format!("the new layout of {fid} names its objects by another FID than the old"),
            );
        }
        // A component kept is the same objects over the same bytes; a new one takes an
        // id no object of the file had, so none shares a name with an old one being
        // destroyed (see `Layout::next_component_id`).
        let first_new = old.next_component_id();
        for c in &layout.components {
            let kept = old.components.iter().find(|o| o.id == c.id);
            match kept {
                Some(o) if same_objects(o, c) => continue,
                Some(_) => {
                    return fail(
                        Errno::Inval,
                        format!("the new layout of {fid} changes the objects of component {}", c.id),
                    )
                }
                None if c.id < first_new => {
                    return fail(
                        Errno::Inval,
                        format!("the new layout of {fid} gives component {} an id the file used before", c.id),
                    )
                }
                None => {}
            }
            if let Some(ost) = misplaced_ost(c, place) {
                return fail(
                    Errno::Inval,
                    format!(
                        "the new layout of {fid} places component {} on OST {ost}: twice, down or out of its pool",
                        c.id
                    ),
                );
            }
        }
        if let Some((start, end)) = uncovered(&old, layout, ino.attr.size) {
            return fail(
                Errno::Inval,
                format!("the new layout of {fid} holds no in-sync copy of bytes [{start}, {end}) (the last one)"),
            );
        }
        let dropped: Vec<layout::Component> =
            old.components.iter().filter(|o| !layout.components.iter().any(|c| c.id == o.id)).cloned().collect();
        let dropped_max = dropped.iter().map(|c| c.id).max().unwrap_or(0);
        self.discard_bytes(
            fid,
            &layout::Layout { generation: old.generation, components: dropped, objects: old.objects },
        )?;
        let mut new = layout.clone();
        // Past every id dropped: see `Layout::next_component_id`.
        new.generation = old.generation.max(layout.generation).max(dropped_max).wrapping_add(1);
        ino.attr.layout = Some(new);
        ino.attr.data_version += 1;
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        Ok(Response::Attr(ino.attr))
    }
}

/// Whether `a` and `b` name the same objects over the same bytes (a component kept
/// by a replaced layout; only its mirror id and flags may change).
fn same_objects(a: &layout::Component, b: &layout::Component) -> bool {
    let strip = |c: &layout::Component| layout::Component { mirror: 0, flags: 0, ..c.clone() };
    strip(a) == strip(b)
}

/// The first range of the file's `size` bytes `old` holds an in-sync copy of (an
/// instantiated component that is not stale) and `new` does not, if any.
fn uncovered(old: &layout::Layout, new: &layout::Layout, size: u64) -> Option<(u64, u64)> {
    let in_sync = |l: &layout::Layout, s: u64, e: u64| {
        l.components.iter().any(|c| c.is_instantiated() && !c.is_stale() && c.extent_start <= s && e <= c.extent_end)
    };
    let mut cuts: Vec<u64> =
        old.components.iter().chain(&new.components).flat_map(|c| [c.extent_start, c.extent_end]).collect();
    cuts.push(size);
    cuts.retain(|&x| x <= size);
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).map(|w| (w[0], w[1])).find(|&(s, e)| in_sync(old, s, e) && !in_sync(new, s, e))
}
