//! The checker against damage. Each test builds a small namespace on real MDT stores
//! through the requests an MDS applies (a writer's batches, written back to the
//! database as a checkpoint writes them), checks that the checker finds it
//! consistent, then damages one thing with a raw write to a table and checks that the
//! checker reports exactly that: the whole list of problems, so a checker that says
//! nothing, or too much, fails.

use std::path::{Path, PathBuf};

use layout::{LayoutSpec, OstState};
use proto::msg::{Attr, Creds, OpenFlags, Request, Response, Timespec, UpdateId, UpdateOp};
use proto::Fid;
use store::memtable::MemTable;
use store::{Batch, Store};

use super::check_namespace;
use crate::mdt::schema::{self, dentry_key};
use crate::mdt::{new_memtable, Inode, Placement, Tbl, Writer};

/// The directory of a test's MDTs, removed when the test ends, passed or failed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("braid-check-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Scratch(d)
    }

    /// The directory of MDT `index`.
    fn mdt(&self, index: u32) -> PathBuf {
        self.0.join(format!("mdt{index}"))
    }

    /// What the checker says of MDTs 0 to `count - 1`.
    fn check(&self, count: u32) -> Vec<String> {
        let dirs: Vec<PathBuf> = (0..count).map(|i| self.mdt(i)).collect();
        check_namespace(&dirs).expect("the checker reads the MDTs")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One MDT's store open for writing as its committer writes it: batches applied
/// through a [`Writer`] into the memtable, which [`Mdt::close`] writes back.
struct Mdt {
    index: u32,
    store: Store,
    mem: MemTable,
    /// The file a client holds open (its last unlink makes it an orphan).
    open: Option<Fid>,
}

impl Mdt {
    /// Formats (or opens again) MDT `index` in `dir`.
    fn open(dir: &Path, index: u32) -> Mdt {
        std::fs::create_dir_all(dir).unwrap();
        let store = Store::open(&dir.join("mdt.redb")).unwrap();
        schema::format(&store, index, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
        Mdt { index, store, mem: new_memtable(), open: None }
    }

    /// Runs `f` as one batch and keeps it (as a logged batch is kept).
    fn batch<T>(&mut self, f: impl FnOnce(&mut Writer<'_>, &mut Placement<'_>) -> T) -> T {
        let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
        let default_layout = LayoutSpec::raid0(Some(1), Some(1 << 20));
        let open = self.open;
        let is_open = move |fid: Fid, _: Option<u64>| Some(fid) == open;
        let mut place = Placement {
            osts: &osts,
            cursor: 0,
            default_layout: &default_layout,
            dom_max: 0,
            is_open: &is_open,
            open_elsewhere: &|_, _| false,
            leave: &|_| true,
        };
        let mut w = Writer::new(self.store.snapshot().unwrap(), &mut self.mem, self.index);
        let out = f(&mut w, &mut place);
        w.finish();
        out
    }

    /// Applies `req`, which must succeed.
    fn apply(&mut self, req: Request) -> Response {
        self.batch(|w, place| w.apply(&req, place)).unwrap_or_else(|e| panic!("{}: {e}", req.op_name()))
    }

    /// Writes the memtable back to the database (a checkpoint) and closes the store,
    /// for the checker to open.
    fn close(self) {
        let mut b = self.store.batch(true).unwrap();
        b.write_back(&self.mem, &schema::TABLES).unwrap();
        b.commit().unwrap();
    }
}

/// Changes the database of the closed MDT in `dir` directly, as damage would.
fn damage(dir: &Path, f: impl FnOnce(&mut Batch)) {
    let store = Store::open(&dir.join("mdt.redb")).unwrap();
    let mut b = store.batch(true).unwrap();
    f(&mut b);
    b.commit().unwrap();
}

/// Rewrites inode `fid` as `edit` changes it.
fn edit_inode(b: &mut Batch, fid: Fid, edit: impl FnOnce(&mut Inode)) {
    let t = Tbl::Inodes.table();
    let mut ino: Inode = store::decode_record(&b.get(t, &fid.to_key()).unwrap().expect("the inode")).unwrap();
    edit(&mut ino);
    b.put(t, &fid.to_key(), &store::encode_record(&ino)).unwrap();
}

fn mkdir(parent: Fid, name: &str) -> Request {
    Request::MdsMkdir { creds: Creds::root(), parent, name: name.into(), mode: 0o755, lease: false, spec: None }
}

fn create(parent: Fid, name: &str) -> Request {
    Request::MdsCreate {
        creds: Creds::root(),
        parent,
        name: name.into(),
        mode: 0o644,
        exclusive: true,
        flags: OpenFlags { read: true, write: true, truncate: false },
        layout: None,
    }
}

fn dir_made(r: Response) -> Attr {
    match r {
        Response::DirMade { attr, .. } => attr,
        other => panic!("not a directory made: {other:?}"),
    }
}

fn created(r: Response) -> Attr {
    match r {
        Response::Created { attr, existed: false, .. } => attr,
        other => panic!("not a file made: {other:?}"),
    }
}

/// The FIDs of the namespace [`one_mdt`] makes.
struct Names {
    d: Fid,
    sub: Fid,
    f: Fid,
    g: Fid,
    gone: Fid,
}

/// MDT 0 holding /d, /d/sub, /d/f, /g with a hard link /d/h, and a file unlinked
/// while open (an orphan), closed; the checker finds it consistent.
fn one_mdt(s: &Scratch) -> Names {
    let mut m = Mdt::open(&s.mdt(0), 0);
    let d = dir_made(m.apply(mkdir(Fid::ROOT, "d"))).fid;
    let sub = dir_made(m.apply(mkdir(d, "sub"))).fid;
    let f = created(m.apply(create(d, "f"))).fid;
    let g = created(m.apply(create(Fid::ROOT, "g"))).fid;
    m.apply(Request::MdsLink { creds: Creds::root(), fid: g, parent: d, name: "h".into() });
    let gone = created(m.apply(create(Fid::ROOT, "gone"))).fid;
    m.open = Some(gone);
    m.apply(Request::MdsUnlink { creds: Creds::root(), parent: Fid::ROOT, name: "gone".into() });
    m.close();
    assert_eq!(s.check(1), Vec::<String>::new(), "the namespace as made");
    Names { d, sub, f, g, gone }
}

#[test]
fn an_entry_naming_a_missing_inode_is_reported() {
    let s = Scratch::new("missing");
    let n = one_mdt(&s);
    damage(&s.mdt(0), |b| b.del(Tbl::Inodes.table(), &n.f.to_key()).unwrap());
    assert_eq!(s.check(1), [format!("entry {}/f names {}, which does not exist", n.d, n.f)]);
}

#[test]
fn a_file_with_a_wrong_link_count_is_reported() {
    let s = Scratch::new("file-nlink");
    let n = one_mdt(&s);
    damage(&s.mdt(0), |b| edit_inode(b, n.g, |ino| ino.attr.nlink = 3));
    assert_eq!(s.check(1), [format!("{} has link count 3, not 2", n.g)]);
}

#[test]
fn a_directory_with_a_wrong_link_count_is_reported() {
    let s = Scratch::new("dir-nlink");
    let n = one_mdt(&s);
    // /d holds one subdirectory: 2 + 1.
    damage(&s.mdt(0), |b| edit_inode(b, n.d, |ino| ino.attr.nlink = 2));
    assert_eq!(s.check(1), [format!("directory {} has link count 2, not 3", n.d)]);
}

#[test]
fn a_directory_whose_dotdot_names_another_directory_is_reported() {
    let s = Scratch::new("dotdot");
    let n = one_mdt(&s);
    damage(&s.mdt(0), |b| edit_inode(b, n.sub, |ino| ino.parent = Some(Fid::ROOT)));
    assert_eq!(s.check(1), [format!("directory {} ({}/sub) has `..` {}", n.sub, n.d, Fid::ROOT)]);
}

#[test]
fn a_file_with_no_entry_that_is_not_an_orphan_is_reported() {
    let s = Scratch::new("lost-file");
    let n = one_mdt(&s);
    damage(&s.mdt(0), |b| b.del(Tbl::Orphans.table(), &n.gone.to_key()).unwrap());
    assert_eq!(s.check(1), [format!("File {} has no entry and is not an orphan", n.gone)]);
}

#[test]
fn a_file_unlinked_while_open_is_an_orphan_not_a_problem() {
    let s = Scratch::new("orphan");
    let n = one_mdt(&s);
    // It is there, with no entry and no link, and the checker (in `one_mdt`) said
    // nothing of it.
    let store = Store::open(&s.mdt(0).join("mdt.redb")).unwrap();
    let b = store.batch(false).unwrap();
    let ino: Inode = store::decode_record(&b.get(Tbl::Inodes.table(), &n.gone.to_key()).unwrap().unwrap()).unwrap();
    assert_eq!(ino.attr.nlink, 0);
    assert!(b.get(Tbl::Orphans.table(), &n.gone.to_key()).unwrap().is_some(), "an orphan");
    assert!(b.get(Tbl::Dentries.table(), &dentry_key(Fid::ROOT, "gone")).unwrap().is_none());
    drop((b, store));
    assert_eq!(s.check(1), Vec::<String>::new());
}

/// The participant's and the coordinator's halves of an operation across MDTs,
/// applied one after the other as the MDSs apply them (see `mdt::update`).
#[test]
fn an_operation_across_mdts_left_undecided_is_reported_on_the_mdt_that_holds_it() {
    let s = Scratch::new("undecided");
    let (mut m0, mut m1) = (Mdt::open(&s.mdt(0), 0), Mdt::open(&s.mdt(1), 1));
    let root = Creds::root;
    // /on1, a remote directory on MDT 1 (coordinated by MDT 0, which holds its entry).
    let made = UpdateId { mdt: 0, seq: 1 };
    let op = UpdateOp::MkdirInode {
        creds: root(),
        parent: Fid::ROOT,
        name: "on1".into(),
        mode: 0o755,
        gid: 0,
        dir_default: None,
        dirs_default: None,
        shard: None,
    };
    let Response::Attr(on1) = m1.apply(Request::MdsUpdate { mdt: 1, id: made, op: Box::new(op) }) else {
        panic!("no directory")
    };
    m0.batch(|w, _| w.link_remote_entry(&root(), Fid::ROOT, "on1", &on1, Timespec::now())).unwrap();
    m1.apply(Request::MdsUpdateDone { mdt: 1, fid: on1.fid, id: made, committed: true });
    // /f on MDT 0, hard linked as /on1/f (coordinated by MDT 1, which holds the entry).
    let f = created(m0.apply(create(Fid::ROOT, "f")));
    let linked = UpdateId { mdt: 1, seq: 1 };
    let op = UpdateOp::LinkInode { fid: f.fid, parent: on1.fid, name: "f".into() };
    let Response::Attr(f) = m0.apply(Request::MdsUpdate { mdt: 0, id: linked, op: Box::new(op) }) else {
        panic!("no link")
    };
    m1.batch(|w, _| w.link_remote_entry(&root(), on1.fid, "f", &f, Timespec::now())).unwrap();
    m0.apply(Request::MdsUpdateDone { mdt: 0, fid: f.fid, id: linked, committed: true });
    m0.close();
    m1.close();
    assert_eq!(s.check(2), Vec::<String>::new(), "the namespace as made");

    // A rename of /on1/f coordinated by MDT 0: MDT 1 holds the removal of the old
    // entry, under the FID of the file (which names MDT 0), and the verdict never
    // comes.
    let mut m1 = Mdt::open(&s.mdt(1), 1);
    let moving = UpdateId { mdt: 0, seq: 2 };
    let op = UpdateOp::RemoveEntry { creds: root(), parent: on1.fid, name: "f".into(), child: f.clone(), dir_to: None };
    m1.apply(Request::MdsUpdate { mdt: 1, id: moving, op: Box::new(op) });
    m1.close();
    assert_eq!(
        s.check(2),
        [format!("MDT 1: RemoveEntry (coordinator MDT 0, {}/f) of {} is still undecided", on1.fid, f.fid)]
    );
}

/// A remote mkdir whose participant (MDT 1) made the directory and whose coordinator
/// (MDT 0) never added the entry, and a link whose participant (MDT 0) counted the
/// link and whose coordinator never added the entry: each is its undecided line
/// alone, not also a lost directory or a link count off by one.
#[test]
fn an_undecided_mkdir_or_link_is_one_line_not_also_a_lost_directory_or_a_wrong_link_count() {
    let s = Scratch::new("undecided-halves");
    let (mut m0, m1) = (Mdt::open(&s.mdt(0), 0), Mdt::open(&s.mdt(1), 1));
    let f = created(m0.apply(create(Fid::ROOT, "f")));
    m0.close();
    m1.close();
    assert_eq!(s.check(2), Vec::<String>::new(), "the namespace as made");

    let (mut m0, mut m1) = (Mdt::open(&s.mdt(0), 0), Mdt::open(&s.mdt(1), 1));
    let made = UpdateId { mdt: 0, seq: 1 };
    let op = UpdateOp::MkdirInode {
        creds: Creds::root(),
        parent: Fid::ROOT,
        name: "half".into(),
        mode: 0o755,
        gid: 0,
        dir_default: None,
        dirs_default: None,
        shard: None,
    };
    let Response::Attr(half) = m1.apply(Request::MdsUpdate { mdt: 1, id: made, op: Box::new(op) }) else {
        panic!("no directory")
    };
    let linked = UpdateId { mdt: 1, seq: 1 };
    let op = UpdateOp::LinkInode { fid: f.fid, parent: half.fid, name: "f".into() };
    let Response::Attr(_) = m0.apply(Request::MdsUpdate { mdt: 0, id: linked, op: Box::new(op) }) else {
        panic!("no link")
    };
    m0.close();
    m1.close();
    let root = Fid::ROOT;
    assert_eq!(
        s.check(2),
        [
            format!("MDT 0: Link (coordinator MDT 1, {}/f) of {} is still undecided", half.fid, f.fid),
            format!("MDT 1: Mkdir (coordinator MDT 0, {root}/half) of {} is still undecided", half.fid),
        ]
    );
}
