//! Batches, undo and leases of the writer, and the refusal of a later database format
//! or record version.

use layout::{LayoutSpec, OstState};
use proto::msg::{Creds, FileKind, OpenFlags, Request, Response, SetAttr, SetBehind, Timespec};
use proto::Fid;
use store::Store;

use super::schema::{self, format, Formatted, FORMAT};
use super::*;
use crate::lease::DirLeases;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fresh(tag: &str) -> (Dir, Store) {
    let d = std::env::temp_dir().join(format!("braid-mdt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let store = Store::open(&d.join("mdt.redb")).unwrap();
    (Dir(d), store)
}

fn mkdir(name: &str) -> Request {
    Request::MdsMkdir {
        creds: Creds::root(),
        parent: Fid::ROOT,
        name: name.into(),
        mode: 0o755,
        lease: false,
        spec: None,
    }
}

/// A placement with `osts`, `default_layout`, DoM up to 1 MiB, the cursor at 0,
/// `is_open` for opens and no file open on another client.
fn placement<'a>(
    osts: &'a [OstState],
    default_layout: &'a LayoutSpec,
    is_open: &'a dyn Fn(Fid, Option<u64>) -> bool,
) -> Placement<'a> {
    fn nowhere_else(_: Fid, _: u64) -> bool {
        false
    }
    Placement {
        osts,
        cursor: 0,
        default_layout,
        dom_max: 1 << 20,
        is_open,
        open_elsewhere: &nowhere_else,
        leave: &|_| true,
    }
}

fn no_placement() -> (Vec<OstState>, LayoutSpec) {
    (vec![], LayoutSpec::raid0(Some(1), Some(1 << 20)))
}

/// Runs `f` with a writer on a freshly formatted MDT (`tag` names its directory; the
/// default layout is one stripe of 1 MiB) and a placement of one OST up, DoM up to
/// 1 MiB, no file open.
fn on_fresh_mdt<T>(tag: &str, f: impl FnOnce(&mut Writer, &mut Placement) -> T) -> T {
    let (_d, store) = fresh(tag);
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (_, default_layout) = no_placement();
    let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    f(&mut w, &mut place)
}

#[test]
fn a_writer_dropped_unfinished_takes_its_batch_back_and_a_finished_one_is_written_back() {
    let (_d, store) = fresh("undo");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (osts, default_layout) = no_placement();
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();

    // A batch that made a directory and was never logged leaves nothing behind.
    {
        let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
        w.apply(&mkdir("lost"), &mut place).unwrap();
        assert!(w.view.entry(Fid::ROOT, "lost").unwrap().is_some(), "the batch sees its own change");
    }
    assert!(mem.is_empty(), "an unfinished batch is undone");

    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    w.apply(&mkdir("kept"), &mut place).unwrap();
    w.finish();
    let view = View::new(store.snapshot().unwrap(), &mem);
    let (fid, kind) = view.entry(Fid::ROOT, "kept").unwrap().expect("kept is visible through the memtable");
    assert_eq!(kind, FileKind::Dir);
    assert!(view.entry(Fid::ROOT, "lost").unwrap().is_none());
    let (names, eof) = view.readdir(&Creds::root(), Fid::ROOT, None, 100, false).unwrap();
    assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["kept"]);
    assert!(eof);
    drop(view);

    // Written back, the database alone answers the same.
    let mut b = store.batch(true).unwrap();
    b.write_back(&mem, &schema::TABLES).unwrap();
    b.commit().unwrap();
    let empty = new_memtable();
    let view = View::new(store.snapshot().unwrap(), &empty);
    assert_eq!(view.entry(Fid::ROOT, "kept").unwrap(), Some((fid, FileKind::Dir)));
    assert_eq!(view.must_inode(Fid::ROOT).unwrap().attr.nlink, 3);
}

fn create(parent: Fid, name: &str) -> Request {
    Request::MdsCreate {
        creds: Creds::root(),
        parent,
        name: name.into(),
        mode: 0o644,
        exclusive: true,
        flags: OpenFlags { read: false, write: true, truncate: false },
        layout: None,
    }
}

#[test]
fn an_entry_change_in_a_directory_leased_by_another_client_is_refused_and_taken_back() {
    let (_d, store) = fresh("lease");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (_, default_layout) = no_placement();
    let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut leases = DirLeases::default();

    // A lease granted in a batch that is dropped unfinished goes with it.
    {
        let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0).with_leases(&mut leases);
        (w.client, w.conn) = (1, 10);
        let req = Request::MdsMkdir {
            creds: Creds::root(),
            parent: Fid::ROOT,
            name: "lost".into(),
            mode: 0o755,
            lease: true,
            spec: None,
        };
        assert!(matches!(w.apply(&req, &mut place).unwrap(), Response::DirMade { lease: Some(_), .. }));
    }
    assert!(leases.is_empty(), "an unfinished batch takes its grants back");

    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0).with_leases(&mut leases);
    (w.client, w.conn) = (1, 10);
    let req = Request::MdsMkdir {
        creds: Creds::root(),
        parent: Fid::ROOT,
        name: "job".into(),
        mode: 0o755,
        lease: true,
        spec: None,
    };
    let Response::DirMade { attr: job, lease: Some(_), .. } = w.apply(&req, &mut place).unwrap() else {
        panic!("mkdir with a lease asked for grants one")
    };
    w.apply(&create(job.fid, "mine"), &mut place).expect("the holder changes its own directory");

    // Another client, and the holder on another connection, are refused; nothing
    // of the refused operation stays.
    for (client, conn) in [(2, 11), (1, 12)] {
        (w.client, w.conn) = (client, conn);
        let sp = w.savepoint();
        match w.apply(&create(job.fid, "theirs"), &mut place) {
            Err(OpError::Leased(dir)) => assert_eq!(dir, job.fid),
            other => panic!("client {client} conn {conn}: expected Leased, got {other:?}"),
        }
        w.rollback(sp);
        assert!(w.view.entry(job.fid, "theirs").unwrap().is_none());
        assert_eq!(w.view.must_inode(job.fid).unwrap().attr.nlink, 2, "the parent's link count is untouched");
    }
    // What does not change the directory's entries is not stopped by the lease.
    (w.client, w.conn) = (2, 11);
    w.apply(&create(Fid::ROOT, "elsewhere"), &mut place).expect("another directory");
    let set = SetAttr { mode: Some(0o700), ..Default::default() };
    w.apply(&Request::MdsSetattr { creds: Creds::root(), fid: job.fid, set }, &mut place).expect("a chmod");
    w.finish();
    assert_eq!(leases.get(job.fid).map(|l| (l.holder, l.conn)), Some((1, 10)));

    // Removing the directory ends its lease.
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0).with_leases(&mut leases);
    (w.client, w.conn) = (1, 10);
    let unlink = Request::MdsUnlink { creds: Creds::root(), parent: job.fid, name: "mine".into() };
    w.apply(&unlink, &mut place).unwrap();
    w.apply(&Request::MdsRmdir { creds: Creds::root(), parent: Fid::ROOT, name: "job".into() }, &mut place).unwrap();
    w.finish();
    assert!(leases.is_empty());
}

#[test]
fn a_database_or_a_record_of_a_later_format_is_refused_with_a_clear_error() {
    let layout = LayoutSpec::raid0(Some(1), Some(1 << 20));
    let (_d, store) = fresh("format");
    assert_eq!(format(&store, 0, &layout).unwrap(), Formatted { fresh: true, format: FORMAT });
    assert_eq!(format(&store, 0, &layout).unwrap(), Formatted { fresh: false, format: FORMAT });

    // An inode record of a later version: reads of it fail and say why.
    let mut b = store.batch(true).unwrap();
    let root = b.get(Tbl::Inodes.table(), &Fid::ROOT.to_key()).unwrap().unwrap();
    b.put(Tbl::Inodes.table(), &Fid::ROOT.to_key(), &store::seal(9, &root[1..])).unwrap();
    b.commit().unwrap();
    let empty = new_memtable();
    let view = View::new(store.snapshot().unwrap(), &empty);
    let err = view.must_inode(Fid::ROOT).unwrap_err().to_string();
    assert!(err.contains("inode record of version 9") && err.contains("later release"), "{err}");
    drop(view);

    // A database of a later format is not opened at all.
    let mut b = store.batch(true).unwrap();
    b.put(Tbl::Meta.table(), b"format", &(FORMAT + 1).to_le_bytes()).unwrap();
    b.commit().unwrap();
    let err = format(&store, 0, &layout).unwrap_err().to_string();
    assert!(err.contains(&format!("format {}", FORMAT + 1)) && err.contains("later braid"), "{err}");
}

/// Creates `name` in the root with a DoM component up to 256 KiB, then a component
/// not instantiated yet; returns its attributes.
fn create_dom_file(w: &mut Writer, place: &mut Placement, name: &str) -> proto::msg::Attr {
    let spec = LayoutSpec {
        components: vec![
            layout::ComponentSpec::dom(256 << 10),
            layout::ComponentSpec { extent_end: layout::EOF, stripe_count: Some(1), ..Default::default() },
        ],
    };
    let Request::MdsCreate { creds, parent, name, mode, exclusive, flags, .. } = create(Fid::ROOT, name) else {
        unreachable!()
    };
    let req = Request::MdsCreate { creds, parent, name, mode, exclusive, flags, layout: Some(spec) };
    let Response::Created { attr, .. } = w.apply(&req, place).unwrap() else { panic!("created") };
    attr
}

#[test]
fn dom_bytes_are_written_read_trimmed_cut_and_dropped_with_the_inode() {
    on_fresh_mdt("dom", |w, place| {
        let attr = create_dom_file(w, place, "d");
        let fid = attr.fid;
        assert_eq!(attr.layout.as_ref().and_then(|l| l.dom_end()), Some(256 << 10));

        // A write across two blocks, and one further on: the gap reads as zeros.
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let write =
            |offset: u64, data: &[u8]| Request::MdsDomWrite { fid, offset, data: data.to_vec(), publish: Some(0) };
        let r = w.apply(&write(10, &data), place).unwrap();
        assert!(matches!(r, Response::DomWritten { bytes: 100_000, size_published: true }), "{r:?}");
        assert_eq!(w.view.must_inode(fid).unwrap().attr.size, 100_010, "the size went with the write");
        let stale = Request::MdsDomWrite { fid, offset: 200_000, data: b"tail".to_vec(), publish: Some(7) };
        let r = w.apply(&stale, place).unwrap();
        assert!(matches!(r, Response::DomWritten { bytes: 4, size_published: false }), "{r:?}");
        assert_eq!(w.view.must_inode(fid).unwrap().attr.size, 100_010, "not under another truncate epoch");
        assert_eq!(w.view.dom_size(fid).unwrap(), 200_004);
        let back = w.view.dom_read(fid, 0, 300_000).unwrap();
        assert_eq!(back.len(), 200_004, "a read stops at the object's end");
        assert_eq!(&back[10..100_010], &data[..]);
        assert!(back[100_010..200_000].iter().all(|&b| b == 0));
        assert_eq!(&back[200_000..], b"tail");

        // Past the DoM component: refused, nothing written.
        let e = w.apply(&write((256 << 10) - 2, b"abcd"), place).unwrap_err();
        assert!(e.to_string().contains("passes the end"), "{e}");

        // A trim keeps the size; a cut shortens.
        w.apply(&Request::MdsDomTrim { fid, offset: 0, len: 150_000 }, place).unwrap();
        assert!(w.view.dom_read(fid, 0, 150_000).unwrap().iter().all(|&b| b == 0));
        assert_eq!(w.view.dom_size(fid).unwrap(), 200_004);
        w.apply(&Request::MdsDomPunch { fid, size: 70_000 }, place).unwrap();
        assert_eq!(w.view.dom_size(fid).unwrap(), 70_000);

        // Unlinking the file drops its blocks with the inode.
        let unlink = Request::MdsUnlink { creds: Creds::root(), parent: Fid::ROOT, name: "d".into() };
        w.apply(&unlink, place).unwrap();
        assert!(w.view.scan_prefix(Tbl::Dom, &fid.to_key()).unwrap().next().is_none(), "no DoM block is left");
    })
}

/// The attributes as inode records of versions 1 and 2 held them (before shard
/// tables), for writing such records.
fn attr_v2(a: &proto::msg::Attr) -> impl serde::Serialize + '_ {
    (a.fid, a.kind, a.mode, a.nlink, a.uid, a.gid, a.size, a.atime, a.mtime, a.ctime, &a.layout, a.rdev, a.trunc_epoch)
}

fn four_osts() -> Vec<OstState> {
    (0..4).map(|index| OstState { index, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }).collect()
}

#[test]
fn inode_records_of_versions_1_to_5_are_read() {
    // Version 1 as it was written: the body of an inode whose directory default has
    // components without a pattern.
    #[derive(serde::Serialize)]
    struct SpecV1 {
        extent_end: u64,
        stripe_count: Option<i64>,
        stripe_size: Option<u64>,
        stripe_offset: Option<u32>,
        ost_list: Option<Vec<u32>>,
        pool: Option<String>,
    }
    let now = proto::msg::Timespec::now();
    let ino = Inode::new(Fid::ROOT, FileKind::Dir, 0o755, &Creds::root(), 0, now);
    let spec = SpecV1 {
        extent_end: layout::EOF,
        stripe_count: Some(4),
        stripe_size: Some(1 << 20),
        stripe_offset: None,
        ost_list: None,
        pool: None,
    };
    let bytes = store::seal(
        1,
        &postcard::to_allocvec(&(attr_v2(&ino.attr), None::<String>, Some(vec![spec]), None::<Fid>)).unwrap(),
    );
    let read: Inode = store::decode_record(&bytes).expect("a version 1 inode is upgraded");
    let d = read.dir_default.expect("the default survives");
    assert_eq!(d, LayoutSpec::raid0(Some(4), Some(1 << 20)));
    assert_eq!(read.attr, ino.attr);
    // Version 2: patterns, no shard table.
    let dom = Some(LayoutSpec { components: vec![layout::ComponentSpec::dom(64 << 10)] });
    let v2 = postcard::to_allocvec(&(attr_v2(&ino.attr), Some("t".to_string()), dom.clone(), Some(Fid::new(0, 1, 7))));
    let read: Inode = store::decode_record(&store::seal(2, &v2.unwrap())).expect("version 2");
    assert_eq!((read.attr.stripes, read.dir_default, read.parent), (None, dom, Some(Fid::new(0, 1, 7))));
    // Version 3: a shard table, no data version.
    let mut striped = ino.clone();
    striped.attr.stripes =
        Some(Box::new(proto::msg::DirStripes { hash: layout::DirHash::Fnv1a64, shards: vec![Fid::ROOT] }));
    let a = &striped.attr;
    let attr_v3 = (
        a.fid,
        a.kind,
        a.mode,
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        a.atime,
        a.mtime,
        a.ctime,
        &a.layout,
        a.rdev,
        a.trunc_epoch,
        &a.stripes,
    );
    let v3 = postcard::to_allocvec(&(attr_v3, None::<String>, None::<LayoutSpec>, None::<Fid>)).unwrap();
    let read: Inode = store::decode_record(&store::seal(3, &v3)).expect("version 3");
    assert_eq!(read, striped, "a version 3 inode reads with data version 0");
    // Version 4: a file's layout whose components have no mirror id and flags.
    let mut file = Inode::new(Fid::new(0, 1, 9), FileKind::File, 0o644, &Creds::root(), 0, now);
    file.attr.data_version = 3;
    let mut l = layout::LayoutSpec::raid0(Some(2), Some(1 << 20)).instantiate(&four_osts(), 1).unwrap();
    l.generation = 5;
    file.attr.layout = Some(l.clone());
    let comps_v4: Vec<_> = l
        .components
        .iter()
        .map(|c| {
            let (id, s, e, p, ss, o, w, pool) =
                (c.id, c.extent_start, c.extent_end, c.pattern, c.stripe_size, &c.osts, c.stripe_count_wanted, &c.pool);
            (id, s, e, p, ss, o, w, pool)
        })
        .collect();
    let a = &file.attr;
    let attr_v4 = (
        (a.fid, a.kind, a.mode, a.nlink, a.uid, a.gid, a.size, a.atime, a.mtime, a.ctime),
        Some((l.generation, comps_v4)),
        (a.rdev, a.trunc_epoch, a.data_version, &a.stripes),
    );
    let v4 = postcard::to_allocvec(&(attr_v4, None::<String>, None::<LayoutSpec>, None::<Fid>)).unwrap();
    let read: Inode = store::decode_record(&store::seal(4, &v4)).expect("version 4");
    assert_eq!(read, file, "a version 4 inode reads with a layout without mirrors");
    assert!(!read.attr.layout.unwrap().is_mirrored());
    // Version 5: a layout whose objects are named by the file's own FID.
    let attr_v5 = (
        (a.fid, a.kind, a.mode, a.nlink, a.uid, a.gid, a.size, a.atime, a.mtime, a.ctime),
        Some((l.generation, &l.components)),
        (a.rdev, a.trunc_epoch, a.data_version, &a.stripes),
    );
    let v5 = postcard::to_allocvec(&(attr_v5, None::<String>, None::<LayoutSpec>, None::<Fid>)).unwrap();
    let read: Inode = store::decode_record(&store::seal(5, &v5)).expect("version 5");
    assert_eq!(read, file, "a version 5 inode reads with a layout naming its own objects");
    let mut moved = file.clone();
    moved.attr.layout.as_mut().unwrap().objects = Some(Fid::new(1, 1, 7).into());
    let read: Inode = store::decode_record(&store::encode_record(&moved)).expect("today's");
    assert_eq!(read, moved, "a moved file's layout keeps the FID its objects are named by");
    // And today's records read back as written.
    let mut now_ino = ino;
    now_ino.attr.data_version = 17;
    now_ino.dir_default = Some(LayoutSpec { components: vec![layout::ComponentSpec::dom(64 << 10)] });
    now_ino.attr.stripes = Some(Box::new(proto::msg::DirStripes {
        hash: layout::DirHash::AllChar,
        shards: vec![Fid::ROOT, Fid::new(1, 1, 2)],
    }));
    let again: Inode = store::decode_record(&store::encode_record(&now_ino)).unwrap();
    assert_eq!(again, now_ino);
}

#[test]
fn a_version_1_decision_is_read_with_each_participant_on_the_mdt_of_its_fid() {
    use schema::{Decision, Participant};
    #[derive(serde::Serialize)]
    struct DecisionV1 {
        participants: Vec<Fid>,
        at: u64,
    }
    let (a, b) = (Fid::new(1, 1, 7), Fid::new(2, 1, 9));
    let v1 = DecisionV1 { participants: vec![a, b], at: 42 };
    let bytes = store::seal(1, &postcard::to_allocvec(&v1).unwrap());
    let read: Decision = store::decode_record(&bytes).expect("a version 1 decision is upgraded");
    assert_eq!(read.participants, [Participant { mdt: 1, fid: a }, Participant { mdt: 2, fid: b }]);
    assert_eq!(read.at, 42);
    // Today's records read back as written, a participant on another MDT than its FID's.
    let now = Decision { participants: vec![Participant { mdt: 0, fid: b }], at: 7 };
    let again: Decision = store::decode_record(&store::encode_record(&now)).unwrap();
    assert_eq!(again.participants, now.participants);
}

#[test]
fn a_directory_being_removed_across_mdts_takes_no_new_entry_until_decided() {
    use proto::msg::{UpdateId, UpdateOp};
    let (_d, store) = fresh("dying");
    format(&store, 1, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let osts = vec![OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    let default_layout = LayoutSpec::raid0(Some(1), Some(1 << 20));
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 1);
    let (made, removing) = (UpdateId { mdt: 0, seq: 1 }, UpdateId { mdt: 0, seq: 2 });
    let op = UpdateOp::MkdirInode {
        creds: Creds::root(),
        parent: Fid::ROOT,
        name: "d".into(),
        mode: 0o777,
        gid: 0,
        dir_default: None,
        dirs_default: None,
        shard: None,
    };
    let Response::Attr(dir) = w.apply(&Request::MdsUpdate { mdt: 1, id: made, op: Box::new(op) }, &mut place).unwrap()
    else {
        panic!("no directory")
    };
    assert_eq!((dir.fid.mdt(), w.inodes_delta), (1, 1));
    w.apply(&Request::MdsUpdateDone { mdt: 1, fid: dir.fid, id: made, committed: true }, &mut place).unwrap();
    let rmdir = UpdateOp::RmdirInode { fid: dir.fid, parent: Fid::ROOT, name: "d".into() };
    w.apply(&Request::MdsUpdate { mdt: 1, id: removing, op: Box::new(rmdir) }, &mut place).unwrap();
    let create = Request::MdsCreate {
        creds: Creds::root(),
        parent: dir.fid,
        name: "f".into(),
        mode: 0o644,
        exclusive: true,
        flags: OpenFlags { read: true, write: true, truncate: false },
        layout: None,
    };
    let link = Request::MdsSymlink { creds: Creds::root(), parent: dir.fid, name: "l".into(), target: "x".into() };
    for req in [&create, &link] {
        match w.apply(req, &mut place) {
            Err(OpError::Errno(proto::Errno::Again, _)) => {}
            other => panic!("{} in a directory being removed: {other:?}", req.op_name()),
        }
    }
    // Aborted: the directory takes entries again.
    w.apply(&Request::MdsUpdateDone { mdt: 1, fid: dir.fid, id: removing, committed: false }, &mut place).unwrap();
    assert!(matches!(w.apply(&create, &mut place).unwrap(), Response::Created { existed: false, .. }));
    assert_eq!(w.inodes_delta, 2, "a directory and a file made");
}

#[test]
fn a_damaged_shard_table_makes_its_directory_unreadable_with_a_clear_error_and_panics_nothing() {
    let (_d, store) = fresh("shards");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (osts, default_layout) = no_placement();
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    let Response::DirMade { attr: dir, .. } = w.apply(&mkdir("s"), &mut place).unwrap() else { panic!("no dir") };
    let mut ino = w.view.must_inode(dir.fid).unwrap();
    let bad = [
        vec![],                                     // no shard
        vec![dir.fid],                              // one
        vec![dir.fid, Fid::new(0, 1, 99)],          // two on one MDT
        vec![Fid::new(1, 1, 5), Fid::new(2, 1, 6)], // not its own table
    ];
    for shards in bad {
        ino.attr.stripes =
            Some(Box::new(proto::msg::DirStripes { hash: layout::DirHash::Fnv1a64, shards: shards.clone() }));
        w.put(Tbl::Inodes, &dir.fid.to_key(), &store::encode_record(&ino)).unwrap();
        match w.view.inode(dir.fid) {
            Err(OpError::Store(e)) => assert!(e.to_string().contains("damaged shard table"), "{e}"),
            other => panic!("{shards:?}: {other:?}"),
        }
        match w.apply(&create(dir.fid, "f"), &mut place) {
            Err(OpError::Store(_)) => {}
            other => panic!("a create in a directory with shards {shards:?}: {other:?}"),
        }
    }
}

#[test]
fn an_entry_held_by_a_rename_across_mdts_is_neither_unlinked_nor_replaced_until_decided() {
    use proto::msg::{UpdateId, UpdateOp};
    let (_d, store) = fresh("held");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let osts = vec![OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    let default_layout = LayoutSpec::raid0(Some(1), Some(1 << 20));
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    // A directory of this MDT holding a file, which MDT 1 coordinates a rename of.
    let Response::DirMade { attr: dir, .. } = w.apply(&mkdir("d"), &mut place).unwrap() else { panic!() };
    let Response::Created { attr: file, .. } = w.apply(&create(dir.fid, "f"), &mut place).unwrap() else { panic!() };
    let moving = UpdateOp::RemoveEntry {
        creds: Creds::root(),
        parent: dir.fid,
        name: "f".into(),
        child: file.clone(),
        dir_to: None,
    };
    let id = UpdateId { mdt: 1, seq: 7 };
    w.apply(&Request::MdsUpdate { mdt: 0, id, op: Box::new(moving) }, &mut place).unwrap();
    let unlink = Request::MdsUnlink { creds: Creds::root(), parent: dir.fid, name: "f".into() };
    let over = Request::MdsRename {
        creds: Creds::root(),
        parent: dir.fid,
        name: "g".into(),
        new_parent: dir.fid,
        new_name: "f".into(),
        flags: Default::default(),
    };
    w.apply(&create(dir.fid, "g"), &mut place).unwrap();
    for req in [&unlink, &over] {
        match w.apply(req, &mut place) {
            Err(OpError::Errno(proto::Errno::Again, _)) => {}
            other => panic!("{} of an entry a rename across MDTs holds: {other:?}", req.op_name()),
        }
    }
    // Decided (committed): the entry goes; then the name is free.
    w.apply(&Request::MdsUpdateDone { mdt: 0, fid: file.fid, id, committed: true }, &mut place).unwrap();
    assert_eq!(w.view.entry(dir.fid, "f").unwrap(), None);
}

#[test]
fn every_change_of_a_files_bytes_moves_its_data_version_and_nothing_else_does() {
    on_fresh_mdt("dataversion", |w, place| {
        let attr = create_dom_file(w, place, "f");
        let fid = attr.fid;
        assert_eq!(attr.data_version, 0);
        let version = |w: &Writer| w.view.must_inode(fid).unwrap().attr.data_version;
        let now = proto::msg::Timespec::now();
        let root = Creds::root();
        let changes: Vec<(&str, Request, u64)> = vec![
            (
                "a DoM write publishing the size",
                Request::MdsDomWrite { fid, offset: 0, data: vec![1; 10], publish: Some(0) },
                1,
            ),
            (
                "a DoM write under another truncate epoch",
                Request::MdsDomWrite { fid, offset: 0, data: vec![2; 10], publish: Some(5) },
                0,
            ),
            (
                "a size report",
                Request::MdsSizeUpdate { fid, size: 10, mtime: Some(now), trunc_epoch: 0, behind: None },
                1,
            ),
            (
                "a size report of an older epoch",
                Request::MdsSizeUpdate { fid, size: 10, mtime: Some(now), trunc_epoch: 4, behind: None },
                0,
            ),
            ("a close with a size", Request::MdsClose { fid, size: Some(10), mtime: Some(now), trunc_epoch: 0 }, 1),
            ("a close with nothing to report", Request::MdsClose { fid, size: None, mtime: None, trunc_epoch: 0 }, 0),
            (
                "a chmod",
                Request::MdsSetattr {
                    creds: root.clone(),
                    fid,
                    set: SetAttr { mode: Some(0o600), ..Default::default() },
                },
                0,
            ),
            (
                "a truncate",
                Request::MdsSetattr { creds: root.clone(), fid, set: SetAttr { size: Some(5), ..Default::default() } },
                1,
            ),
            (
                "an instantiation",
                Request::MdsLayoutChange {
                    creds: root.clone(),
                    fid,
                    change: layout::LayoutChange::Instantiate { end: 1 << 20 },
                },
                1,
            ),
            (
                "an instantiation with nothing left to instantiate",
                Request::MdsLayoutChange {
                    creds: root.clone(),
                    fid,
                    change: layout::LayoutChange::Instantiate { end: 1 << 20 },
                },
                0,
            ),
        ];
        for (what, req, moves) in changes {
            let before = version(w);
            w.apply(&req, place).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(version(w), before + moves, "{what}");
        }
        // A writer that died with the file open: its unreported bytes move the version;
        // a directory or a FID that is gone are left alone.
        let before = version(w);
        w.data_moved(fid).unwrap();
        assert_eq!(version(w), before + 1, "a departed writer");
        let root_version = w.view.must_inode(Fid::ROOT).unwrap().attr.data_version;
        w.data_moved(Fid::ROOT).unwrap();
        w.data_moved(Fid { oid: fid.oid + 1000, ..fid }).unwrap();
        assert_eq!(w.view.must_inode(Fid::ROOT).unwrap().attr.data_version, root_version);
    })
}

/// A DoM-only layout as a client's create carries it (seed 002's Table 5).
fn dom_layout() -> layout::Layout {
    let spec = LayoutSpec::template("seed-table5").unwrap();
    let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    spec.instantiate(&osts, 0).unwrap()
}

/// Two OSTs up, for placements made outside the MDS's own.
fn osts_up() -> Vec<OstState> {
    (0..2).map(|index| OstState { index, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }).collect()
}

fn create_granted(name: &str, fid: Fid, layout: layout::Layout) -> Request {
    Request::MdsCreateGranted {
        creds: Creds::root(),
        parent: Fid::ROOT,
        name: name.into(),
        mode: 0o640,
        flags: OpenFlags { read: false, write: true, truncate: false },
        fid,
        layout,
        data: vec![],
        lease: 0,
    }
}

#[test]
fn a_clients_create_takes_granted_unused_fids_and_layouts_the_mds_could_have_given() {
    let (_d, store) = fresh("granted");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (_, default_layout) = no_placement();
    let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30, pools: vec![] }];
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);

    // The MDS's own next FID is past any grant, and a grant past the MDS's block.
    let own = match w.apply(&create(Fid::ROOT, "own"), &mut place) {
        Ok(Response::Created { attr, .. }) => attr.fid,
        r => panic!("{r:?}"),
    };
    let Ok(Response::FidGrant { first, count }) = w.apply(&Request::MdsFidGrant { mdt: 0, count: 100 }, &mut place)
    else {
        panic!("no grant")
    };
    assert_eq!(count, 100);
    assert!(first.oid > own.oid, "a grant starts past the MDS's own FIDs");
    let Ok(Response::FidGrant { first: second, .. }) =
        w.apply(&Request::MdsFidGrant { mdt: 0, count: 100 }, &mut place)
    else {
        panic!("no grant")
    };
    assert!(second.oid >= first.oid + 100, "grants do not overlap");

    let fid = Fid { oid: first.oid + 7, ..first };
    match w.apply(&create_granted("a", fid, dom_layout()), &mut place) {
        Ok(Response::Created { attr, existed: false, .. }) => {
            assert_eq!((attr.fid, attr.mode, attr.size), (fid, 0o640, 0));
            assert_eq!(attr.layout, Some(dom_layout()));
        }
        r => panic!("{r:?}"),
    }
    // A retry answers the same; another name with that FID, or the name with another
    // FID, is refused.
    assert!(matches!(
        w.apply(&create_granted("a", fid, dom_layout()), &mut place),
        Ok(Response::Created { existed: false, .. })
    ));
    let errno = |r: OpResult<Response>| match r {
        Err(OpError::Errno(e, _)) => e,
        r => panic!("expected an error, got {r:?}"),
    };
    assert_eq!(errno(w.apply(&create_granted("b", fid, dom_layout()), &mut place)), proto::Errno::Exist);
    let other = Fid { oid: first.oid + 8, ..first };
    assert_eq!(errno(w.apply(&create_granted("a", other, dom_layout()), &mut place)), proto::Errno::Exist);
    // FIDs never granted: the MDS's own, one past the last grant, another MDT's.
    for bad in
        [Fid { oid: own.oid + 1, ..own }, Fid { oid: second.oid + 100, ..second }, Fid::new(1, first.seq as u32, 9)]
    {
        assert_eq!(errno(w.apply(&create_granted("c", bad, dom_layout()), &mut place)), proto::Errno::Inval, "{bad}");
    }
    // A layout with OST objects must be one the MDS could give the file now: the
    // directory's default (one 1 MiB stripe) on an OST that is up. Not DoM with its
    // second component placed, nor on an unknown OST, nor twice on one, nor with
    // another stripe size.
    let mut placed = dom_layout();
    placed.components[1].osts = vec![0];
    assert_eq!(errno(w.apply(&create_granted("d", other, placed), &mut place)), proto::Errno::Inval);
    let plain = |osts: Vec<u32>, stripe_size: u64| {
        let mut l = LayoutSpec::raid0(Some(osts.len() as i64), Some(stripe_size)).instantiate(&osts_up(), 0).unwrap();
        l.components[0].osts = osts;
        l
    };
    for bad in [plain(vec![3], 1 << 20), plain(vec![0, 0], 1 << 20), plain(vec![0], 64 << 10)] {
        assert_eq!(
            errno(w.apply(&create_granted("d", other, bad.clone()), &mut place)),
            proto::Errno::Inval,
            "{bad:?}"
        );
    }
    assert!(w.view.entry(Fid::ROOT, "d").unwrap().is_none(), "nothing refused was made");
    let placed_fid = Fid { oid: first.oid + 9, ..first };
    match w.apply(&create_granted("e", placed_fid, plain(vec![0], 1 << 20)), &mut place) {
        Ok(Response::Created { attr, existed: false, .. }) => assert_eq!(attr.layout, Some(plain(vec![0], 1 << 20))),
        r => panic!("{r:?}"),
    }
    w.finish();

    // After the batch is written back (a restart), the grant still holds.
    let mut b = store.batch(true).unwrap();
    b.write_back(&mem, &schema::TABLES).unwrap();
    b.commit().unwrap();
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    assert!(matches!(w.apply(&create_granted("d", other, dom_layout()), &mut place), Ok(Response::Created { .. })));
}

#[test]
fn a_clients_create_keeps_the_osts_a_directorys_default_names() {
    let (_d, store) = fresh("granted-explicit");
    format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
    let (_, default_layout) = no_placement();
    let osts = osts_up();
    let is_open = |_: Fid, _: Option<u64>| false;
    let mut place = placement(&osts, &default_layout, &is_open);
    let mut mem = new_memtable();
    let mut w = Writer::new(store.snapshot().unwrap(), &mut mem, 0);
    let Ok(Response::FidGrant { first, .. }) = w.apply(&Request::MdsFidGrant { mdt: 0, count: 10 }, &mut place) else {
        panic!("no grant")
    };
    let on = |ost: u32| {
        let mut l = LayoutSpec::raid0(Some(1), Some(1 << 20)).instantiate(&osts, 0).unwrap();
        l.components[0].osts = vec![ost];
        l
    };
    // Free placement: either OST.
    for (i, ost) in [0, 1].into_iter().enumerate() {
        let r = w.apply(
            &create_granted(&format!("free{ost}"), Fid { oid: first.oid + i as u32, ..first }, on(ost)),
            &mut place,
        );
        assert!(matches!(r, Ok(Response::Created { .. })), "{r:?}");
    }
    // `lfs setstripe -i 1` on the directory: OST 1 only.
    let mut spec = LayoutSpec::raid0(Some(1), Some(1 << 20));
    spec.components[0].stripe_offset = Some(1);
    let set = Request::MdsSetDirLayout { creds: Creds::root(), fid: Fid::ROOT, spec: Some(spec) };
    assert!(w.apply(&set, &mut place).is_ok());
    let fid = Fid { oid: first.oid + 2, ..first };
    match w.apply(&create_granted("fixed", fid, on(0)), &mut place) {
        Err(OpError::Errno(e, why)) => assert_eq!(e, proto::Errno::Inval, "{why}"),
        r => panic!("a placement against the default's -i was taken: {r:?}"),
    }
    assert!(matches!(w.apply(&create_granted("fixed", fid, on(1)), &mut place), Ok(Response::Created { .. })));
}

#[test]
fn a_clients_create_may_carry_the_files_first_bytes_within_its_dom_component() {
    on_fresh_mdt("granted-data", |w, place| {
        let Ok(Response::FidGrant { first, .. }) = w.apply(&Request::MdsFidGrant { mdt: 0, count: 10 }, place) else {
            panic!("no grant")
        };
        let with_data = |name: &str, fid: Fid, data: Vec<u8>| match create_granted(name, fid, dom_layout()) {
            Request::MdsCreateGranted { creds, parent, name, mode, flags, fid, layout, .. } => {
                Request::MdsCreateGranted { creds, parent, name, mode, flags, fid, layout, data, lease: 0 }
            }
            _ => unreachable!(),
        };
        let dom_end = dom_layout().dom_end().unwrap();
        let data: Vec<u8> = (0..dom_end).map(|i| (i % 251) as u8).collect();
        let version = match w.apply(&with_data("a", first, data.clone()), place) {
            Ok(Response::Created { attr, existed: false, .. }) => {
                assert_eq!(attr.size, dom_end, "the size is published with the bytes");
                attr.data_version
            }
            r => panic!("{r:?}"),
        };
        assert_eq!(w.view.dom_read(first, 0, dom_end).unwrap(), data);
        assert_eq!(w.view.must_inode(first).unwrap().attr.data_version, version);

        // One byte past the DoM component: refused, and nothing is made.
        let second = Fid { oid: first.oid + 1, ..first };
        match w.apply(&with_data("b", second, vec![7; dom_end as usize + 1]), place) {
            Err(OpError::Errno(e, why)) => assert_eq!(e, proto::Errno::Inval, "{why}"),
            r => panic!("expected a refusal, got {r:?}"),
        }
        assert!(w.view.entry(Fid::ROOT, "b").unwrap().is_none());
        assert!(w.view.inode(second).unwrap().is_none());
        assert_eq!(w.view.dom_size(second).unwrap(), 0);
    })
}

#[test]
fn a_size_report_may_carry_the_attributes_set_behind_and_a_refused_change_is_left_out() {
    on_fresh_mdt("report-behind", |w, place| {
        let fid = create_dom_file(w, place, "f").fid;
        let attr = |w: &Writer| w.view.must_inode(fid).unwrap().attr;
        let old = Timespec { sec: 1_000_000, nsec: 0 };
        // `tar x` as root: owner, mode and times set after the writes, then the close.
        let set = SetAttr {
            uid: Some(7),
            gid: Some(8),
            mode: Some(0o600),
            mtime: Some(proto::msg::TimeSet::At(old)),
            ..Default::default()
        };
        let version = attr(w).data_version;
        let behind = Some(Box::new(SetBehind { creds: Creds::root(), set }));
        let a = match w.apply(&Request::MdsSizeUpdate { fid, size: 12_345, mtime: None, trunc_epoch: 0, behind }, place)
        {
            Ok(Response::Attr(a)) => a,
            r => panic!("{r:?}"),
        };
        assert_eq!((a.uid, a.gid, a.mode, a.size, a.mtime), (7, 8, 0o600, 12_345, old));
        assert_eq!(a.data_version, version + 1, "the report moved the data version once");
        assert_eq!(attr(w), a, "the answer is what the MDT holds");

        // A user who may not give the file away: the report holds, the change of owner
        // is left out, and the answer shows it.
        let user = Creds { uid: 1000, gid: 1000, groups: vec![] };
        let set = SetAttr { uid: Some(0), mode: Some(0o644), ..Default::default() };
        let behind = Some(Box::new(SetBehind { creds: user, set }));
        let b = match w
            .apply(&Request::MdsSizeUpdate { fid, size: 20_000, mtime: Some(old), trunc_epoch: 0, behind }, place)
        {
            Ok(Response::Attr(a)) => a,
            r => panic!("{r:?}"),
        };
        assert_eq!((b.uid, b.mode, b.size), (7, 0o600, 20_000));
        // Truncated from elsewhere: nothing is applied, the set included.
        let set = SetAttr { mode: Some(0o640), ..Default::default() };
        let behind = Some(Box::new(SetBehind { creds: Creds::root(), set }));
        let r = w.apply(&Request::MdsSizeUpdate { fid, size: 30, mtime: None, trunc_epoch: 9, behind }, place);
        assert!(matches!(r, Ok(Response::EpochMoved { .. })), "{r:?}");
        assert_eq!(attr(w), b);
    })
}

#[test]
fn a_writers_report_without_an_mtime_keeps_the_times_set_since_its_writes() {
    on_fresh_mdt("keep-mtime", |w, place| {
        let fid = create_dom_file(w, place, "f").fid;
        let attr = |w: &Writer| w.view.must_inode(fid).unwrap().attr;
        // `tar` and `cp -p`: the writes, then the times set through the descriptor, then
        // the close reports the size.
        let old = proto::msg::Timespec { sec: 1_000_000, nsec: 0 };
        let set = SetAttr { mtime: Some(proto::msg::TimeSet::At(old)), ..Default::default() };
        w.apply(&Request::MdsSetattr { creds: Creds::root(), fid, set }, place).unwrap();
        let version = attr(w).data_version;
        w.apply(&Request::MdsSizeUpdate { fid, size: 10, mtime: None, trunc_epoch: 0, behind: None }, place).unwrap();
        w.apply(&Request::MdsClose { fid, size: Some(20), mtime: None, trunc_epoch: 0 }, place).unwrap();
        let a = attr(w);
        assert_eq!((a.size, a.mtime), (20, old), "the size grows, the mtime set stays");
        assert!(a.ctime > old, "the change time moves");
        assert_eq!(a.data_version, version + 2, "the bytes changed");
        // A report of writes made after the times were set moves the mtime.
        let now = proto::msg::Timespec::now();
        w.apply(&Request::MdsClose { fid, size: Some(20), mtime: Some(now), trunc_epoch: 0 }, place).unwrap();
        assert_eq!(attr(w).mtime, now);
    })
}

/// `MdsReplaceLayout` of `fid` by root.
fn replace_req(fid: Fid, layout: &layout::Layout, data_version: u64) -> Request {
    Request::MdsReplaceLayout { creds: Creds::root(), fid, layout: layout.clone(), data_version }
}

/// The errno of a refused operation.
fn refused(r: OpResult<Response>) -> proto::Errno {
    match r {
        Err(OpError::Errno(c, _)) => c,
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_replaced_layout_queues_the_old_objects_drops_dom_bytes_and_a_changed_or_open_file_is_refused() {
    on_fresh_mdt("replace", |w, place| {
        let a = match w.apply(&create(Fid::ROOT, "a"), place) {
            Ok(Response::Created { attr, .. }) => attr,
            r => panic!("{r:?}"),
        };
        let old = a.layout.clone().unwrap();
        // The copy's layout: the same shape under a new component id.
        let mut copy = old.clone();
        copy.components[0].id = 7;
        let replace = |layout: &layout::Layout, data_version| replace_req(a.fid, layout, data_version);
        let code = refused;
        assert_eq!(code(w.apply(&replace(&copy, a.data_version + 1), place)), proto::Errno::Again, "changed since");
        let mut reused = old.clone();
        reused.components[0].stripe_size *= 2;
        assert_eq!(
            code(w.apply(&replace(&reused, a.data_version), place)),
            proto::Errno::Inval,
            "an old id, new objects"
        );
        let mut elsewhere = copy.clone();
        elsewhere.components[0].osts = vec![5];
        assert_eq!(code(w.apply(&replace(&elsewhere, a.data_version), place)), proto::Errno::Inval, "no such OST");
        let busy_open = |_: Fid, _: u64| true;
        let mut busy = Placement { open_elsewhere: &busy_open, ..*place };
        assert_eq!(code(w.apply(&replace(&copy, a.data_version), &mut busy)), proto::Errno::Busy);
        let queued = |w: &mut Writer| w.view.scan(Tbl::Destroy, std::ops::Bound::Unbounded).unwrap().count();
        assert_eq!(queued(w), 0, "nothing queued by the refusals");

        let Ok(Response::Attr(after)) = w.apply(&replace(&copy, a.data_version), place) else { panic!("replace") };
        let got = after.layout.unwrap();
        assert_eq!(got.components, copy.components, "the file has the copy's objects");
        assert!(got.generation > old.generation, "a newer generation");
        assert_eq!(after.data_version, a.data_version + 1);
        assert_eq!((after.fid, after.size), (a.fid, a.size));
        assert_eq!(queued(w), 1, "the old objects are queued for destruction");

        // A Data-on-MDT file moves onto OSTs: its bytes on the MDT go. A new layout
        // with a DoM component is refused.
        let Ok(Response::FidGrant { first, .. }) = w.apply(&Request::MdsFidGrant { mdt: 0, count: 10 }, place) else {
            panic!("no grant")
        };
        let dom = Fid { oid: first.oid + 1, ..first };
        assert!(matches!(w.apply(&create_granted("dom", dom, dom_layout()), place), Ok(Response::Created { .. })));
        let write = Request::MdsDomWrite { fid: dom, offset: 0, data: vec![7; 5000], publish: None };
        assert!(w.apply(&write, place).is_ok());
        assert_eq!(w.view.dom_size(dom).unwrap(), 5000);
        let v = w.view.must_inode(dom).unwrap().attr.data_version;
        let onto = |layout: layout::Layout| Request::MdsReplaceLayout {
            creds: Creds::root(),
            fid: dom,
            layout,
            data_version: v,
        };
        let mut with_dom = dom_layout();
        with_dom.components.iter_mut().for_each(|c| c.id += 10);
        let r = w.apply(&onto(with_dom), place);
        assert_eq!(code(r), proto::Errno::NotSup, "a new layout with a DoM component");
        let Ok(Response::Attr(moved)) = w.apply(&onto(copy.clone()), place) else { panic!("DoM onto OSTs") };
        assert_eq!(moved.layout.unwrap().components, copy.components);
        assert_eq!(w.view.dom_size(dom).unwrap(), 0, "its bytes on the MDT are dropped");
    });
}

#[test]
fn mirrors_are_added_marked_stale_before_a_write_and_split_without_losing_the_last_in_sync_copy() {
    on_fresh_mdt("mirrors", |w, place| {
        let a = match w.apply(&create(Fid::ROOT, "a"), place) {
            Ok(Response::Created { attr, .. }) => attr,
            r => panic!("{r:?}"),
        };
        let set = SetAttr { size: Some(1000), ..Default::default() };
        w.apply(&Request::MdsSetattr { creds: Creds::root(), fid: a.fid, set }, place).unwrap();
        let version = |w: &mut Writer| w.view.must_inode(a.fid).unwrap().attr.data_version;
        let layout_now = |w: &mut Writer| w.view.must_inode(a.fid).unwrap().attr.layout.unwrap();
        let replace = |layout: &layout::Layout, data_version| replace_req(a.fid, layout, data_version);
        let code = refused;
        let queued = |w: &mut Writer| w.view.scan(Tbl::Destroy, std::ops::Bound::Unbounded).unwrap().count();
        // Extended: the file's component becomes mirror 1, a copy mirror 2.
        let old = a.layout.clone().unwrap();
        let mut two = old.clone();
        two.components[0].mirror = 1;
        let second = layout::Component { id: 65538, mirror: 2, ..two.components[0].clone() };
        two.components.push(second);
        let v = version(w);
        w.apply(&replace(&two, v), place).unwrap();
        assert_eq!(layout_now(w).mirror_count(), 2);
        assert_eq!(queued(w), 0, "a component kept keeps its objects");

        // A write through mirror 1 makes mirror 2 stale, in the stored inode.
        let intent = |mirror| Request::MdsLayoutChange {
            creds: Creds::root(),
            fid: a.fid,
            change: layout::LayoutChange::WriteIntent { mirror, start: 0, end: 100 },
        };
        w.apply(&intent(1), place).unwrap();
        let l = layout_now(w);
        assert!(!l.components[0].is_stale() && l.components[1].is_stale(), "{l:?}");
        assert_eq!(code(w.apply(&intent(2), place)), proto::Errno::Stale, "a stale mirror takes no write");

        // Mirror 1 holds the only in-sync copy: it stays.
        let mut only_stale = l.clone();
        only_stale.components.remove(0);
        let v = version(w);
        assert_eq!(code(w.apply(&replace(&only_stale, v), place)), proto::Errno::Inval);
        assert_eq!(layout_now(w).mirror_count(), 2, "refused: nothing changed");
        // Mirror 2 goes, its objects with it; its ids are never taken again.
        let mut first = l.clone();
        first.components.remove(1);
        w.apply(&replace(&first, v), place).unwrap();
        let l = layout_now(w);
        assert_eq!((l.mirror_count(), queued(w)), (1, 1));
        assert!(l.next_component_id() > 65538, "{l:?}");
        let mut again = l.clone();
        again.components.push(layout::Component { id: 65538, mirror: 2, flags: 0, ..l.components[0].clone() });
        let v = version(w);
        assert_eq!(code(w.apply(&replace(&again, v), place)), proto::Errno::Inval, "an id the file used before");
        // Nor are a mirrored file's components added by setstripe.
        let add = Request::MdsLayoutChange {
            creds: Creds::root(),
            fid: a.fid,
            change: layout::LayoutChange::AddComponents(LayoutSpec::raid0(Some(1), None)),
        };
        assert_eq!(code(w.apply(&add, place)), proto::Errno::Inval);
    });
}
