//! Creates this client answers itself (CephFS's asynchronous create, for the case
//! braid's directory leases make safe).
//!
//! Traced through a mount, writing a small file is a CREATE the application waits for
//! (one MDS round trip, 200 µs here), then bytes whose flush already finishes after
//! close(2) returns (see [`crate::deferred`]). The CREATE's answer is a file that the
//! client can tell in advance, when:
//!
//! - it holds and trusts the lease on the directory, which says the name is new: no
//!   other client can have made it, nor look for it before the MDS takes the lease
//!   back (and the revocation's ack waits for the create, see below);
//! - it knows the layout the directory gives new files, from the last create this
//!   client made there (less than [`TEMPLATE_AGE`] ago), or in the directory it made
//!   this one in. A layout that places nothing on OSTs (a Data-on-MDT component first
//!   and the rest uninstantiated, seed 002's Table 5) is taken as it is. One with OST
//!   objects is taken with the same OSTs, which the MDS accepts if it could have
//!   chosen them itself (the directory's default, on OSTs that are up, in its pools,
//!   and on those it names if it names any). So that a burst of creates does not pile
//!   onto the OSTs of one file, each create such a template serves moves on to the
//!   next OSTs up, as the MDS's round robin would, when the MDS said its placement
//!   was free (no `-o` or `-i`: [`rotate`]); and a template serves
//!   [`PLACEMENT_REUSE`] creates at most, then the next create goes to the MDS, which
//!   places it and gives the next template;
//! - it has a FID to give the file, from a grant of the directory's MDT
//!   ([`proto::Request::MdsFidGrant`]), which records it durably so a create naming
//!   it is accepted after a restart too;
//! - the caller may write in the directory, by the attributes that create returned.
//!
//! Then the client answers with the attributes the MDS will give the file (owner,
//! group by the set-group-ID rule, mode, times now, that layout), and sends
//! [`proto::Request::MdsCreateGranted`] in the background. A small file is written
//! right after its create, so the create waits a little ([`HOLD`]) for the file's
//! first bytes and takes them along: one request for the file where two were, and
//! one transaction on the MDS. Anything else that needs the file on its MDT (its
//! flush, a read, a write elsewhere than at offset 0, any other MDS request of this
//! client, a lease revocation) sends the create at once. Until it is answered:
//!
//! - the create holds a deferred ticket, so every request of this client that could
//!   observe the file (all MDS requests but the deferred flushes' own) waits for it,
//!   and so does the ack of a lease revocation: no one else can look before the file
//!   is there;
//! - the handle's I/O to the MDT (its DoM bytes), its flush, fsync and close wait for
//!   the create's answer ([`Gate`]) and fail with its error if it failed; a failed
//!   create is also reported by the next fsync, as a failed deferred flush is.
//!
//! What it gives up, as the deferred flush does: a mount killed before the create
//! reaches the MDS leaves no file, though its open(2) returned. A create the MDS
//! refuses although the client's checks passed (a directory whose mode another client
//! changed within [`TEMPLATE_AGE`], a full MDT) fails the file's later writes, flush
//! and close instead of the open.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use layout::Layout;
use proto::msg::{Attr, ClusterConfig, Creds, FileKind, Timespec};
use proto::{Errno, Fid};
use tokio::sync::{oneshot, watch};

use crate::{ClientError, Result};

/// How long the directory attributes and layout a create returned serve creates the
/// client answers itself (the kernel's own attribute cache time).
pub const TEMPLATE_AGE: Duration = Duration::from_secs(1);
/// FIDs one grant asks for.
pub const GRANT_COUNT: u32 = 4096;
/// A grant is asked for once fewer FIDs than this remain.
const GRANT_LOW: u64 = 1024;
/// After a grant failed (an MDS restarting, or one that grants none), how long
/// creates go to the MDS before the next grant is asked for.
pub const GRANT_RETRY: Duration = Duration::from_secs(30);
/// Longest name of a directory entry (the MDS refuses longer ones).
pub const NAME_MAX: usize = 255;
/// Most directories whose create template is kept.
const TEMPLATES_MAX: usize = 1024;
/// Most creates answered here on the OSTs of one file the MDS placed (see the
/// module's doc): one create in this many pays a round trip, and rotates the OSTs.
pub const PLACEMENT_REUSE: u32 = 16;
/// Longest a create answered here waits for its file's first bytes before it is sent
/// without them.
pub const HOLD: Duration = Duration::from_millis(20);
const S_ISGID: u32 = 0o2000;
/// Bits of `MAY_WRITE | MAY_EXEC`.
const MAY_WRITE_EXEC: u32 = 2 | 1;

/// What the last create in a directory showed about the next one.
#[derive(Clone)]
pub(crate) struct Template {
    pub layout: Layout,
    pub dir: Attr,
    at: Instant,
    /// For a layout with OST objects: creates it may still serve, shared with the
    /// templates of directories made from it (see [`AsyncCreates::inherit`]).
    left: Option<Arc<AtomicU32>>,
    /// The MDS chose its OSTs freely (no `-o`, `-i`): each create it serves moves on
    /// to the next OSTs (see [`rotate`]).
    pub(crate) free: bool,
    /// Creates it served so far: how far the next one moves on.
    pub(crate) served: u32,
}

impl Template {
    /// Whether the file's first bytes go to its MDT (and may go with its create).
    pub(crate) fn dom_first(&self) -> bool {
        self.layout.components.first().is_some_and(|c| c.is_dom())
    }
}

/// A create sent in the background: held back until its first bytes come (or
/// anything else needs it), then its answer, `None` until it comes.
pub struct Gate {
    tx: watch::Sender<Option<std::result::Result<(), (Errno, String)>>>,
    /// Where the file's first bytes go to the create, while it is held back; taken
    /// (and dropped) to send it without them.
    held: Mutex<Option<oneshot::Sender<Vec<u8>>>>,
}

impl Gate {
    /// Sends the create now, if it is still held back.
    pub(crate) fn release(&self) {
        self.held.lock().expect("held create").take();
    }

    /// Hands the file's first bytes (at offset 0, within its DoM component and one
    /// request) to the create, to go with it: `Ok` if they will, and then the
    /// create's answer (see [`Gate::wait`]) is theirs. The bytes come back if the
    /// create went without them.
    pub(crate) fn attach(&self, data: Vec<u8>) -> std::result::Result<(), Vec<u8>> {
        match self.held.lock().expect("held create").take() {
            Some(tx) => tx.send(data),
            None => Err(data),
        }
    }

    /// Sends the create if it is still held back, and waits for its answer: its error
    /// if it failed.
    pub(crate) async fn wait(&self) -> Result<()> {
        self.release();
        let mut rx = self.tx.subscribe();
        let r = match rx.wait_for(|v| v.is_some()).await {
            Ok(v) => v.clone().expect("waited for an answer"),
            Err(_) => Err((Errno::Io, "the create was abandoned".to_string())),
        };
        r.map_err(|(errno, why)| ClientError::Errno(errno, format!("the file's create failed: {why}")))
    }

    pub(crate) fn open(&self, r: std::result::Result<(), (Errno, String)>) {
        self.tx.send_replace(Some(r));
    }
}

/// FIDs granted by one MDT and not used yet.
#[derive(Default)]
struct Pool {
    ranges: VecDeque<(Fid, u64)>,
    left: u64,
}

/// One client's state for creates it answers itself.
#[derive(Default)]
pub struct AsyncCreates {
    templates: Mutex<HashMap<Fid, Template>>,
    pools: Mutex<HashMap<u32, Pool>>,
    /// Per MDT: whether a grant is being asked for, and until when none is asked for
    /// after one failed.
    granting: Mutex<HashMap<u32, (bool, Option<Instant>)>>,
    /// Creates answered here so far.
    pub(crate) answered: AtomicU64,
}

impl AsyncCreates {
    /// Remembers what a create in `dir` returned, if its layout lets the next ones be
    /// answered here (a new file's layout).
    pub(crate) fn learn(&self, dir: Fid, file: &Attr, dir_attr: &Attr, free: bool) {
        let Some(layout) = file.layout.as_ref().filter(|l| answerable(l)) else {
            self.forget(dir);
            return;
        };
        let placed = layout.components.iter().any(|c| !c.osts.is_empty());
        let left = placed.then(|| Arc::new(AtomicU32::new(PLACEMENT_REUSE)));
        let tpl = Template { layout: layout.clone(), dir: dir_attr.clone(), at: Instant::now(), left, free, served: 0 };
        self.keep(dir, tpl);
    }

    fn keep(&self, dir: Fid, tpl: Template) {
        let mut t = self.templates.lock().expect("templates");
        if t.len() >= TEMPLATES_MAX && !t.contains_key(&dir) {
            t.retain(|_, v| v.at.elapsed() < TEMPLATE_AGE);
            if t.len() >= TEMPLATES_MAX {
                return;
            }
        }
        t.insert(dir, tpl);
    }

    /// Drops what this client knew of `dir` (it changed the directory), and returns
    /// it.
    pub(crate) fn forget(&self, dir: Fid) -> Option<Template> {
        self.templates.lock().expect("templates").remove(&dir)
    }

    /// After this client made directory `child` (attributes `child_attr`) in `parent`
    /// (now `parent_attr`), whose template `tpl` was: the parent keeps it with its new
    /// attributes, and the child, on the same MDT, starts from it. A new directory
    /// inherits its parent's default layout on the MDS (or, under the root, falls back
    /// to the same file system default), so its files get the same layout. The age
    /// and the creates left stay the parent's.
    pub(crate) fn inherit(&self, tpl: Template, parent_attr: &Attr, child_attr: &Attr) {
        if tpl.at.elapsed() >= TEMPLATE_AGE {
            return;
        }
        if child_attr.fid.mdt() == parent_attr.fid.mdt() {
            self.keep(child_attr.fid, Template { dir: child_attr.clone(), ..tpl.clone() });
        }
        self.keep(parent_attr.fid, Template { dir: parent_attr.clone(), ..tpl });
    }

    /// The template of `dir`, if recent, not used up, and `creds` may create there by
    /// it; a create answered by it counts as one use.
    pub(crate) fn template(&self, dir: Fid, creds: &Creds) -> Option<Template> {
        let mut t = self.templates.lock().expect("templates");
        let tpl = t.get(&dir).filter(|t| t.at.elapsed() < TEMPLATE_AGE)?;
        if !tpl.dir.may(creds, MAY_WRITE_EXEC) {
            return None;
        }
        let mut served = 0;
        if let Some(left) = &tpl.left {
            match left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
                Ok(n) => served = PLACEMENT_REUSE - n + 1,
                Err(_) => {
                    t.remove(&dir);
                    return None;
                }
            }
        }
        let mut tpl = tpl.clone();
        tpl.served = served;
        Some(tpl)
    }

    /// A FID of MDT `mdt` for a create answered here, if a grant has one left; and
    /// whether a new grant should be asked for (one at a time per MDT).
    pub(crate) fn take_fid(&self, mdt: u32) -> (Option<Fid>, bool) {
        let mut pools = self.pools.lock().expect("fid pools");
        let pool = pools.entry(mdt).or_default();
        let fid = pool.ranges.front_mut().map(|(first, n)| {
            let fid = *first;
            first.oid += 1;
            *n -= 1;
            fid
        });
        if pool.ranges.front().is_some_and(|(_, n)| *n == 0) {
            pool.ranges.pop_front();
        }
        if fid.is_some() {
            pool.left -= 1;
        }
        let low = pool.left < GRANT_LOW;
        drop(pools);
        let ask = low && {
            let mut g = self.granting.lock().expect("granting");
            let (asking, not_before) = g.entry(mdt).or_default();
            let due = not_before.is_none_or(|t| Instant::now() >= t);
            let ask = !*asking && due;
            *asking |= ask;
            ask
        };
        (fid, ask)
    }

    /// Gives back a FID [`AsyncCreates::take_fid`] gave that was not used.
    pub(crate) fn put_back(&self, fid: Fid) {
        let mut pools = self.pools.lock().expect("fid pools");
        let pool = pools.entry(fid.mdt()).or_default();
        pool.ranges.push_front((fid, 1));
        pool.left += 1;
    }

    /// A grant came back, or failed (`None`: the next is asked for [`GRANT_RETRY`]
    /// later).
    pub(crate) fn granted(&self, mdt: u32, grant: Option<(Fid, u32)>) {
        let ok = grant.is_some_and(|(_, count)| count > 0);
        let not_before = (!ok).then(|| Instant::now() + GRANT_RETRY);
        self.granting.lock().expect("granting").insert(mdt, (false, not_before));
        if let Some((first, count)) = grant.filter(|_| ok) {
            let mut pools = self.pools.lock().expect("fid pools");
            let pool = pools.entry(mdt).or_default();
            pool.ranges.push_back((first, count as u64));
            pool.left += count as u64;
        }
    }

    /// FIDs left in the grants of MDT `mdt`.
    pub fn fids_left(&self, mdt: u32) -> u64 {
        self.pools.lock().expect("fid pools").get(&mdt).map_or(0, |p| p.left)
    }
}

/// Whether `layout` is a new file's, which the next files may take: nothing changed
/// since the MDS gave it, and its first component has its place (DoM or OSTs).
fn answerable(layout: &Layout) -> bool {
    layout.generation == 1 && layout.components.first().is_some_and(|c| c.is_instantiated())
}

/// The attributes the MDS will give file `fid`, made by `creds` with `mode` in the
/// directory `tpl` describes (`Attr::new_inode` and the set-group-ID rule of the MDS).
pub(crate) fn new_file_attr(fid: Fid, creds: &Creds, mode: u32, tpl: &Template) -> Attr {
    let gid = if tpl.dir.mode & S_ISGID != 0 { tpl.dir.gid } else { creds.gid };
    let mut attr = Attr::new_inode(fid, FileKind::File, mode, creds, gid, Timespec::now());
    attr.layout = Some(tpl.layout.clone());
    attr
}

/// A new gate, shared by the handle and the task that sends the create, and what
/// that task waits on for the file's first bytes (see [`first_bytes`]).
pub(crate) fn gate() -> (std::sync::Arc<Gate>, oneshot::Receiver<Vec<u8>>) {
    let (tx, rx) = oneshot::channel();
    (std::sync::Arc::new(Gate { tx: watch::channel(None).0, held: Mutex::new(Some(tx)) }), rx)
}

/// Holds a create back until it is to be sent: the file's first bytes came (they are
/// returned, to go with it), its gate was released, someone waits for this client's
/// deferred work (`hurry`, see [`crate::deferred::Deferred::idle`]), or [`HOLD`]
/// passed. Empty when it goes without bytes.
pub(crate) async fn first_bytes(mut held: oneshot::Receiver<Vec<u8>>, mut hurry: watch::Receiver<u64>) -> Vec<u8> {
    tokio::select! {
        r = &mut held => return r.unwrap_or_default(),
        _ = hurry.changed() => {}
        _ = tokio::time::sleep(HOLD) => {}
    }
    // Bytes handed over as the wait ended still go; later ones come back to their
    // writer (`Gate::attach`).
    held.close();
    held.try_recv().unwrap_or_default()
}

/// The template's layout for the `k`-th create it serves, as the MDS's round robin
/// would place it: a component the MDS placed freely (see [`Template::free`]) moves on
/// `k` times its stripe count over the OSTs that `config` says are up in its pool (in
/// index order), starting where the template's first OST is. A component with no
/// OSTs, or one whose OSTs are not all among those up, stays as it is. (It runs for
/// most creates answered here: it reads the configuration in place.)
pub(crate) fn rotate(layout: &mut Layout, k: u32, config: &ClusterConfig) {
    for c in layout.components.iter_mut().filter(|c| !c.osts.is_empty()) {
        let pool = c.pool.as_ref().map(|p| config.pool(p).map_or(&[][..], |p| &p.osts[..]));
        let mut up: Vec<u32> = config
            .osts
            .iter()
            .filter(|t| t.up && pool.is_none_or(|members| members.contains(&t.index)))
            .map(|t| t.index)
            .collect();
        up.sort_unstable();
        let n = up.len();
        let Some(first) = up.iter().position(|&i| i == c.osts[0]) else { continue };
        if c.osts.len() > n || c.osts.iter().any(|o| !up.contains(o)) {
            continue;
        }
        let start = first + k as usize * c.osts.len();
        c.osts = (0..c.osts.len()).map(|j| up[(start + j) % n]).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::LayoutSpec;

    fn dom() -> Layout {
        let osts = [layout::OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
        LayoutSpec::template("seed-table5").unwrap().instantiate(&osts, 0).unwrap()
    }

    fn dir_attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr { mode, uid, gid, ..dummy() }
    }

    #[test]
    fn a_free_template_moves_on_over_the_osts_up_in_its_pool() {
        let target = |index: u32, up: bool| proto::msg::TargetInfo {
            kind: proto::msg::TargetKind::Ost,
            index,
            uuid: format!("ost{index}"),
            address: "127.0.0.1:1".into(),
            up,
            usage: proto::msg::Usage { avail_bytes: 1 << 30, total_bytes: 1 << 30, ..Default::default() },
            media: None,
        };
        let config = ClusterConfig {
            fsname: "braid".into(),
            generation: 1,
            mdts: vec![],
            osts: vec![target(0, true), target(1, true), target(2, false), target(3, true)],
            pools: vec![proto::msg::PoolInfo { name: "hot".into(), osts: vec![1, 2, 3] }],
            root_squash: None,
        };
        let osts = config.ost_states();
        let spec = LayoutSpec::raid0(Some(1), Some(1 << 20));
        let placed = spec.instantiate(&osts, 1).unwrap();
        assert_eq!(placed.components[0].osts, vec![1]);
        let at = |k| {
            let mut l = placed.clone();
            rotate(&mut l, k, &config);
            l.components[0].osts.clone()
        };
        assert_eq!((at(0), at(1), at(2), at(3)), (vec![1], vec![3], vec![0], vec![1]), "round robin over OSTs up");
        // In a pool: its OSTs that are up only.
        let mut hot = placed.clone();
        hot.components[0].pool = Some("hot".into());
        let mut next = hot.clone();
        rotate(&mut next, 1, &config);
        assert_eq!(next.components[0].osts, vec![3]);
        rotate(&mut next, 1, &config);
        assert_eq!(next.components[0].osts, vec![1], "OST 2 is down");
        // Two stripes move on by two; more stripes than OSTs up stay as they are.
        let two = LayoutSpec::raid0(Some(2), Some(1 << 20)).instantiate(&osts, 0).unwrap();
        let mut moved = two.clone();
        rotate(&mut moved, 1, &config);
        assert_eq!((two.components[0].osts.clone(), moved.components[0].osts.clone()), (vec![0, 1], vec![3, 0]));
        let mut dom = dom();
        let before = dom.clone();
        rotate(&mut dom, 5, &config);
        assert_eq!(dom, before, "a component without OSTs stays");
        let mut wide = LayoutSpec::raid0(Some(-1), Some(1 << 20)).instantiate(&osts, 0).unwrap();
        let all = wide.clone();
        rotate(&mut wide, 1, &ClusterConfig { osts: config.osts[..2].to_vec(), ..config.clone() });
        assert_eq!(wide, all, "more stripes than OSTs up: it stays");
    }

    fn dummy() -> Attr {
        Attr::new_inode(Fid::new(0, 1, 1), FileKind::Dir, 0o755, &Creds::root(), 0, Timespec::default())
    }

    #[test]
    fn a_template_serves_new_files_layouts_to_callers_who_may_write_and_not_for_long() {
        let a = AsyncCreates::default();
        let dir = Fid::new(0, 1, 5);
        let file = Attr { layout: Some(dom()), kind: FileKind::File, ..dummy() };
        a.learn(dir, &file, &dir_attr(0o755, 1000, 1000), true);
        let owner = Creds { uid: 1000, gid: 1000, groups: vec![] };
        let other = Creds { uid: 1001, gid: 1001, groups: vec![] };
        assert!(a.template(dir, &owner).is_some());
        assert!(a.template(dir, &other).is_none(), "no write permission in the directory");

        let mut grown = dom();
        grown.generation += 1;
        a.learn(dir, &Attr { layout: Some(grown), ..file.clone() }, &dir_attr(0o755, 1000, 1000), true);
        assert!(a.template(dir, &owner).is_none(), "a layout changed since the create is not a new file's");

        a.learn(dir, &file, &dir_attr(0o755, 1000, 1000), true);
        a.templates.lock().unwrap().get_mut(&dir).unwrap().at -= TEMPLATE_AGE;
        assert!(a.template(dir, &owner).is_none(), "too old");
    }

    #[test]
    fn a_placed_template_serves_a_few_creates_then_the_mds_places_again_and_new_directories_share_it() {
        let a = AsyncCreates::default();
        let osts = [layout::OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
        let plain = LayoutSpec::raid0(Some(1), Some(1 << 20)).instantiate(&osts, 0).unwrap();
        let (dir, child) = (Fid::new(0, 1, 5), Fid::new(0, 1, 6));
        let file = Attr { layout: Some(plain.clone()), kind: FileKind::File, ..dummy() };
        a.learn(dir, &file, &Attr { fid: dir, ..dir_attr(0o755, 0, 0) }, true);
        let root = Creds::root();
        for _ in 0..3 {
            assert_eq!(a.template(dir, &root).unwrap().layout, plain);
        }
        // A directory made here starts from its parent's template, with its own
        // attributes, and the two share what is left.
        let tpl = a.forget(dir).unwrap();
        a.inherit(tpl, &Attr { fid: dir, ..dir_attr(0o755, 0, 0) }, &Attr { fid: child, ..dir_attr(0o700, 7, 7) });
        assert_eq!(a.template(child, &root).unwrap().dir.uid, 7);
        let served = (0..).take_while(|_| a.template(dir, &root).is_some()).count();
        assert_eq!(served as u32, PLACEMENT_REUSE - 4);
        assert!(a.template(child, &root).is_none(), "used up in the child too");
        assert!(a.template(dir, &root).is_none(), "the next create goes to the MDS");

        // On another MDT the child gets none (another MDS may place otherwise).
        a.learn(dir, &file, &Attr { fid: dir, ..dir_attr(0o755, 0, 0) }, true);
        let elsewhere = Fid::new(1, 1, 6);
        a.inherit(
            a.forget(dir).unwrap(),
            &Attr { fid: dir, ..dir_attr(0o755, 0, 0) },
            &Attr { fid: elsewhere, ..dummy() },
        );
        assert!(a.template(elsewhere, &root).is_none());
        assert!(a.template(dir, &root).is_some());
    }

    #[test]
    fn the_set_group_id_directory_gives_its_group() {
        let creds = Creds { uid: 1000, gid: 1000, groups: vec![] };
        let tpl = Template {
            layout: dom(),
            dir: Attr { mode: 0o2775, gid: 50, ..dummy() },
            at: Instant::now(),
            left: None,
            free: false,
            served: 0,
        };
        let a = new_file_attr(Fid::new(0, 1, 9), &creds, 0o100644, &tpl);
        assert_eq!((a.uid, a.gid, a.mode, a.size, a.nlink), (1000, 50, 0o644, 0, 1));
        let tpl = Template { dir: Attr { mode: 0o775, gid: 50, ..dummy() }, ..tpl };
        assert_eq!(new_file_attr(Fid::new(0, 1, 9), &creds, 0o644, &tpl).gid, 1000);
    }

    #[test]
    fn fids_come_from_grants_in_order_and_a_grant_is_asked_for_once_when_low() {
        let a = AsyncCreates::default();
        let (none, ask) = a.take_fid(0);
        assert!(none.is_none() && ask, "no grant yet: ask for one");
        assert!(!a.take_fid(0).1, "one grant at a time");
        a.granted(0, Some((Fid::new(0, 1, 100), 2)));
        a.granted(0, Some((Fid::new(0, 1, 500), GRANT_COUNT)));
        let got: Vec<u32> = (0..3).map(|_| a.take_fid(0).0.unwrap().oid).collect();
        assert_eq!(got, [100, 101, 500]);
        assert_eq!(a.fids_left(0), GRANT_COUNT as u64 - 1);
        a.granted(1, None);
        assert_eq!(a.take_fid(1), (None, false), "no grant asked for right after one failed");
        a.granting.lock().unwrap().get_mut(&1).unwrap().1 = Some(Instant::now());
        assert_eq!(a.take_fid(1), (None, true), "asked for again once the wait is over");
    }

    #[tokio::test]
    async fn a_gate_answers_every_waiter_with_the_creates_outcome() {
        let (g, _held) = gate();
        let w = {
            let g = g.clone();
            tokio::spawn(async move { g.wait().await })
        };
        g.open(Err((Errno::NoSpc, "full".into())));
        assert_eq!(w.await.unwrap().unwrap_err().errno(), Errno::NoSpc);
        assert_eq!(g.wait().await.unwrap_err().errno(), Errno::NoSpc, "and those that come later");
    }

    #[tokio::test]
    async fn a_held_create_takes_the_first_bytes_or_goes_without_them() {
        let hurry = watch::channel(0u64).0;
        // The first bytes come: they go with the create.
        let (g, held) = gate();
        let task = tokio::spawn(rpc::stats::in_current_job(first_bytes(held, hurry.subscribe())));
        assert_eq!(g.attach(b"abc".to_vec()), Ok(()));
        assert_eq!(task.await.unwrap(), b"abc");
        assert_eq!(g.attach(b"late".to_vec()), Err(b"late".to_vec()), "once only");

        // Released (a flush, a read): it goes at once, and bytes after that come back.
        let (g, held) = gate();
        let task = tokio::spawn(rpc::stats::in_current_job(first_bytes(held, hurry.subscribe())));
        g.release();
        assert!(task.await.unwrap().is_empty());
        assert!(g.attach(b"x".to_vec()).is_err());

        // Hurried (another request of the client waits): the same.
        let (g, held) = gate();
        let task = tokio::spawn(rpc::stats::in_current_job(first_bytes(held, hurry.subscribe())));
        tokio::task::yield_now().await;
        hurry.send_modify(|n| *n += 1);
        assert!(task.await.unwrap().is_empty());
        assert!(g.attach(b"x".to_vec()).is_err());

        // Nothing comes: it goes after HOLD.
        let (g, held) = gate();
        let at = Instant::now();
        assert!(first_bytes(held, hurry.subscribe()).await.is_empty());
        assert!(at.elapsed() >= HOLD);
        assert!(g.attach(b"x".to_vec()).is_err());
    }
}
