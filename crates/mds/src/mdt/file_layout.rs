//! Changes to the layout of an existing file: PFL instantiation (the components a
//! write or truncate reaches get their OSTs) and `setstripe --component-add/-del`.
//!
//! Each change is one mutation of the batch like any other: journaled with it, so an
//! instantiation survives a crash once acknowledged and is never half done, and kept in
//! the reply cache, so a retried request gets the first answer. Two clients racing to
//! instantiate the same component are ordered by the committer: the second finds it
//! instantiated, changes nothing, and gets the layout the first made.
use layout::LayoutChange;
use proto::msg::{Creds, FileKind, Response, Timespec};
use proto::{Errno, Fid};

use super::error::{fail, OpError, OpResult};
use super::writer::{Placement, Writer};
use crate::inode::MAY_WRITE;

impl Writer<'_> {
    pub(super) fn layout_change(
        &mut self,
        creds: &Creds,
        fid: Fid,
        change: &LayoutChange,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.view.must_inode(fid)?;
        if ino.attr.kind != FileKind::File {
            return fail(Errno::Inval, format!("{fid} is not a regular file: only files have layouts"));
        }
        // Adding or deleting components is a change of the file, as Lustre's setstripe
        // on a file: it needs write permission. An instantiation chooses OSTs and
        // changes no byte; it comes from a writer or a truncate, so it needs write
        // permission too, or the file open by this client (permission was checked at
        // open, and a mode changed since must not fail its writes), or the owner (who
        // may write a file created read-only through the descriptor that created it,
        // also after an MDS restart forgot the opens).
        let writer = ino.may(creds, MAY_WRITE)
            || matches!(change, LayoutChange::Instantiate { .. })
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
