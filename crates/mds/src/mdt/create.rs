//! Namespace operations that add a name: create (with the layout a new file gets),
//! mkdir, symlink, mknod and link.
use layout::{Layout, LayoutSpec, Pattern};
use proto::msg::{Creds, DirSpec, FileKind, OpenFlags, Response, Timespec, DOM_WRITE_MAX};
use proto::{Errno, Fid};

use super::error::{fail, OpError, OpResult};
use super::schema::{check_name, dentry_key, dentry_value, Tbl, SYMLINK_MAX};
use super::view::check_open;
use super::writer::{Placement, Writer};
use crate::inode::{Inode, MAY_EXEC, MAY_WRITE, S_ISGID};

/// Applies this MDS's cap on Data-on-MDT (`--dom-max`, Lustre's `dom_stripesize`) to
/// the layout of a new file. With a cap of 0 the DoM component is dropped and the file
/// starts on its OST components. A DoM component above the cap is refused when the
/// request asked for it, and cut to the cap when it came from a default (a default
/// set before the cap was lowered must not make a directory unusable).
pub(super) fn cap_dom(mut spec: LayoutSpec, dom_max: u64, asked: bool) -> OpResult<LayoutSpec> {
    let Some(first) = spec.components.first_mut() else { return Ok(spec) };
    if first.pattern != Pattern::Mdt {
        return Ok(spec);
    }
    if dom_max == 0 {
        spec.components.remove(0);
        if spec.components.is_empty() {
            return fail(Errno::Inval, "Data-on-MDT is off on this MDS (--dom-max 0) and the layout has nothing else");
        }
        return Ok(spec);
    }
    if first.extent_end > dom_max {
        if asked {
            return fail(
                Errno::Inval,
                format!(
                    "a DoM component of {} bytes exceeds this MDS's limit of {dom_max} bytes (--dom-max)",
                    first.extent_end
                ),
            );
        }
        first.extent_end = dom_max;
        if spec.components.get(1).is_some_and(|next| next.extent_end <= dom_max) {
            return fail(Errno::Inval, format!("the default layout's DoM component cannot be cut to {dom_max} bytes"));
        }
    }
    Ok(spec)
}

/// `wanted` instantiated as this MDS places a new file now.
fn placed(wanted: &LayoutSpec, place: &Placement<'_>) -> OpResult<Layout> {
    if place.osts.is_empty() {
        return fail(Errno::Again, "the MDS has not learned the OST list from the MGS yet");
    }
    wanted.instantiate(place.osts, place.cursor).map_err(|e| {
        let code = match e {
            layout::PlacementError::NoOstUp | layout::PlacementError::NoOstUpInPool(_) => Errno::NoSpc,
            _ => Errno::Inval,
        };
        OpError::Errno(code, format!("cannot place file: {e}"))
    })
}

/// An OST that component `c` names twice, or that is not up or not in the
/// component's pool by `place`: where a layout this MDS did not place itself (a
/// client's async create, a migration's copy) may not put objects.
pub(super) fn misplaced_ost(c: &layout::Component, place: &Placement<'_>) -> Option<u32> {
    c.osts.iter().enumerate().find_map(|(i, ost)| {
        let fits =
            |o: &layout::OstState| o.index == *ost && o.up && c.pool.as_ref().is_none_or(|p| o.pools.contains(p));
        (c.osts[..i].contains(ost) || !place.osts.iter().any(fits)).then_some(*ost)
    })
}

/// Most links a file may have.
pub const LINK_MAX: u32 = 65000;

impl Writer<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        exclusive: bool,
        flags: OpenFlags,
        spec: Option<LayoutSpec>,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, name, false)?;
        if let Some((fid, kind)) = self.view.entry(parent, name)? {
            if exclusive {
                return fail(Errno::Exist, format!("{name} exists"));
            }
            // (A directory's inode may be on another MDT.)
            if kind == FileKind::Dir {
                return fail(Errno::IsDir, format!("{name} is a directory"));
            }
            if fid.mdt() != self.mdt_index {
                // A link to a file on another MDT: the client opens it there.
                return Err(OpError::Elsewhere(fid, kind));
            }
            let ino = self.view.must_inode(fid)?;
            if ino.attr.kind == FileKind::Dir {
                return fail(Errno::IsDir, format!("{name} is a directory"));
            }
            check_open(&ino, creds, flags)?;
            return Ok(Response::Created { attr: ino.attr.clone(), existed: true, dir: None, free: false });
        }
        if !dir.may(creds, MAY_WRITE | MAY_EXEC) {
            return fail(Errno::Access, "permission denied creating in this directory");
        }
        self.view.takes_entries(parent)?;
        let wanted = self.new_file_spec(&dir, spec, place)?;
        let free = wanted.components.iter().all(|c| !c.placed_explicitly());
        let layout = placed(&wanted, place)?;
        let fid = self.new_fid()?;
        let gid = if dir.attr.mode & S_ISGID != 0 { dir.attr.gid } else { creds.gid };
        let mut ino = Inode::new(fid, FileKind::File, mode, creds, gid, now);
        ino.attr.layout = Some(layout);
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, FileKind::File))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Created { attr: ino.attr.clone(), existed: false, dir: Some(dir.attr.clone()), free })
    }

    /// A create a client answered itself (`MdsCreateGranted`): `fid` must come from a
    /// grant of this MDT and be unused. `layout` either places nothing on OSTs (its
    /// instantiated components are all DoM, within this MDS's cap), or is one this MDS
    /// could have given a new file in `parent` now (see [`Writer::fits_placement`]).
    /// `data`, if any, is the file's first bytes, written in the same transaction. A
    /// retry of one already applied answers as the first time.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_granted(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        fid: Fid,
        layout: &Layout,
        data: &[u8],
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let dom_max = place.dom_max;
        let mut dir = self.view.dir_for(creds, parent, name, false)?;
        if let Some((existing, _)) = self.view.entry(parent, name)? {
            if existing == fid {
                let ino = self.view.must_inode(fid)?;
                return Ok(Response::Created {
                    attr: ino.attr,
                    existed: false,
                    dir: Some(dir.attr.clone()),
                    free: false,
                });
            }
            return fail(Errno::Exist, format!("{name} exists (the client's directory lease said it did not)"));
        }
        if !dir.may(creds, MAY_WRITE | MAY_EXEC) {
            return fail(Errno::Access, "permission denied creating in this directory");
        }
        if !self.fid_granted(fid)? {
            return fail(
                Errno::Inval,
                format!("{fid} was not granted by MDT {} for a client's create", self.mdt_index),
            );
        }
        if self.view.inode(fid)?.is_some() {
            return fail(Errno::Exist, format!("{fid} is in use"));
        }
        layout.validate().map_err(|e| OpError::Errno(Errno::Inval, format!("layout of {name}: {e}")))?;
        let first_dom = layout.components.first().is_some_and(|c| c.is_dom() && c.extent_end <= dom_max);
        let placed = layout.components.iter().any(|c| !c.is_dom() && !c.osts.is_empty());
        if placed {
            self.fits_placement(&dir, layout, place)?;
        } else if !first_dom || layout.generation != 1 {
            return fail(
                Errno::Inval,
                format!("a client's create must have a new layout with a DoM component of at most {dom_max} bytes first, or one placed as this directory's default would be"),
            );
        }
        let dom_end = layout.dom_end().unwrap_or(0);
        if data.len() as u64 > dom_end.min(DOM_WRITE_MAX) {
            return fail(
                Errno::Inval,
                format!(
                    "a create's first {} bytes pass the end of the DoM component ({dom_end}) or one request's {DOM_WRITE_MAX}",
                    data.len()
                ),
            );
        }
        self.view.takes_entries(parent)?;
        let gid = if dir.attr.mode & S_ISGID != 0 { dir.attr.gid } else { creds.gid };
        let mut ino = Inode::new(fid, FileKind::File, mode, creds, gid, now);
        ino.attr.layout = Some(layout.clone());
        if !data.is_empty() {
            // As a DoM write publishing its size (`dom_write`).
            ino.attr.size = data.len() as u64;
            ino.attr.data_version += 1;
            self.dom_fill_new(fid, data)?;
        }
        self.inodes_delta += 1;
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, FileKind::File))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Created { attr: ino.attr.clone(), existed: false, dir: Some(dir.attr.clone()), free: false })
    }

    /// Whether `layout`, with OST objects, which a client chose for a new file in `dir`
    /// (the layout of the last file this MDS made there, see the client's
    /// `async_create`), is one this MDS could give it now: the directory's default
    /// component for component, each placed component on as many distinct OSTs, known
    /// and up, as this MDS would choose, and on the very OSTs it would choose where the
    /// default names them (`-o`, `-i`). Which OSTs a free placement takes is the
    /// client's choice, as Lustre's MDS takes whichever precreated objects it has.
    fn fits_placement(&self, dir: &Inode, layout: &Layout, place: &Placement<'_>) -> OpResult<()> {
        let spec = self.new_file_spec(dir, None, place)?;
        let mine = placed(&spec, place)?;
        let refuse = |why: String| fail(Errno::Inval, format!("a client's layout for a new file {why}"));
        if layout.generation != 1 || layout.components.len() != mine.components.len() {
            return refuse(format!(
                "has {} components where this directory's default gives {}",
                layout.components.len(),
                mine.components.len()
            ));
        }
        for ((c, m), s) in layout.components.iter().zip(&mine.components).zip(&spec.components) {
            let same_shape = (c.id, c.extent_start, c.extent_end, c.pattern, c.stripe_size, c.stripe_count_wanted)
                == (m.id, m.extent_start, m.extent_end, m.pattern, m.stripe_size, m.stripe_count_wanted)
                && c.pool == m.pool;
            if !same_shape {
                return refuse(format!("differs from this directory's default in component {}", m.id));
            }
            if c.osts.len() != m.osts.len() {
                return refuse(format!(
                    "places component {} on {} OSTs where {} are due",
                    m.id,
                    c.osts.len(),
                    m.osts.len()
                ));
            }
            if s.placed_explicitly() && c.osts != m.osts {
                return refuse(format!("places component {} elsewhere than its default names", m.id));
            }
            if let Some(ost) = misplaced_ost(c, place) {
                return refuse(format!("places component {} on OST {ost}, twice, not up or out of its pool", m.id));
            }
        }
        Ok(())
    }

    /// What a new file's layout asks for, before it is placed: the request, filled
    /// from the parent directory's default, then from the file system default, with
    /// this MDS's DoM cap.
    fn new_file_spec(&self, dir: &Inode, spec: Option<LayoutSpec>, place: &Placement<'_>) -> OpResult<LayoutSpec> {
        let root_default =
            if dir.dir_default.is_none() { self.view.inode(Fid::ROOT)?.and_then(|r| r.dir_default) } else { None };
        let mut fallback = dir.dir_default.clone().or(root_default).unwrap_or_else(|| place.default_layout.clone());
        fallback = fallback.inherit(place.default_layout);
        let asked = spec.is_some();
        cap_dom(spec.unwrap_or_else(|| fallback.clone()).inherit(&fallback), place.dom_max, asked)
    }

    pub(super) fn mkdir(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        want_lease: bool,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        let fid = self.new_fid()?;
        let setgid = dir.attr.mode & S_ISGID != 0;
        let gid = if setgid { dir.attr.gid } else { creds.gid };
        let mut ino = Inode::new(fid, FileKind::Dir, mode | if setgid { S_ISGID } else { 0 }, creds, gid, now);
        ino.parent = Some(parent);
        // Subdirectories inherit their parent's default layout (the root's default is
        // the file system default and is not copied).
        if parent != Fid::ROOT {
            ino.dir_default = dir.dir_default.clone();
        }
        self.put_inode(fid, &ino)?;
        // ... and its default for new directories.
        if let Some(d) = self.view.dirs_default(parent)? {
            self.put(Tbl::Xattrs, &dentry_key(fid, DirSpec::XATTR), &d.to_xattr())?;
        }
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, FileKind::Dir))?;
        self.touch_dir(parent, &mut dir, now, 1)?;
        let lease = if want_lease { self.grant_lease(fid) } else { None };
        Ok(Response::DirMade { attr: ino.attr.clone(), parent: dir.attr.clone(), lease })
    }

    pub(super) fn symlink(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        target: &str,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return fail(Errno::NameTooLong, "symlink target empty or too long");
        }
        self.make_leaf(creds, parent, name, FileKind::Symlink, 0o777, now, |ino| {
            ino.attr.size = target.len() as u64;
            ino.symlink = Some(target.to_string());
        })
    }

    /// A special file: an inode and its entry, nothing on any OST.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mknod(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        if !matches!(kind, FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice | FileKind::Socket) {
            return fail(Errno::Inval, format!("mknod makes special files, not a {kind:?}"));
        }
        if kind.is_device() && creds.uid != 0 {
            return fail(Errno::Perm, "only root may make device files");
        }
        self.make_leaf(creds, parent, name, kind, mode, now, |ino| {
            ino.attr.rdev = if kind.is_device() { rdev } else { 0 };
        })
    }

    /// A new inode without data on any OST (a symlink or a special file), filled in by
    /// `fill`, and its entry `name` in `parent`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_leaf(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        now: Timespec,
        fill: impl FnOnce(&mut Inode),
    ) -> OpResult<Response> {
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        let fid = self.new_fid()?;
        let gid = if dir.attr.mode & S_ISGID != 0 { dir.attr.gid } else { creds.gid };
        let mut ino = Inode::new(fid, kind, mode, creds, gid, now);
        fill(&mut ino);
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, kind))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Attr(ino.attr.clone()))
    }

    pub(super) fn link(
        &mut self,
        creds: &Creds,
        fid: Fid,
        parent: Fid,
        name: &str,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut ino = self.view.must_inode(fid)?;
        if ino.attr.kind == FileKind::Dir {
            return fail(Errno::Perm, "hard links to directories are not allowed");
        }
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        if ino.attr.nlink >= LINK_MAX {
            return fail(Errno::Range, "too many links");
        }
        ino.attr.nlink += 1;
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, ino.attr.kind))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Attr(ino.attr.clone()))
    }
}
