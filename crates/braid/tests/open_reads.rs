//! What an open brings besides the handle, through real processes over TCP: a small
//! file's bytes read from its OST beside the open (the client's `first_bytes`), and
//! whether the file has extended attributes at all (the client's `xattrless`). Both
//! must give what the MDS and the OSTs hold once the open is answered: another
//! client's rewrite, growth, truncate or new attribute closed before the open is seen,
//! and so is this client's own write still on its way.

use std::path::Path;

use bytes::Bytes;
use client::Client;
use proto::msg::{Creds, OpenFlags, SetAttr, XattrMode};
use proto::Fid;
use testkit::{within, Cluster, ClusterSpec};

const RO: OpenFlags = OpenFlags { read: true, write: false, truncate: false };
const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

/// Creates `name` in `dir` holding `data`, closed.
async fn put(c: &Client, creds: &Creds, dir: Fid, name: &str, data: &[u8]) -> Fid {
    let (f, attr, _) = c.create(creds, dir, name, 0o644, true, RW, None).await.unwrap();
    c.write(&f, 0, Bytes::copy_from_slice(data)).await.unwrap();
    c.flush(&f).await.unwrap();
    c.close(f).await.unwrap();
    attr.fid
}

/// Rewrites `fid` from offset 0 with `data`, cut to its length first when `cut`.
async fn rewrite(c: &Client, creds: &Creds, fid: Fid, data: &[u8], cut: bool) {
    let (f, _) = c.open(creds, fid, RW).await.unwrap();
    if cut {
        let set = SetAttr { size: Some(data.len() as u64), by_writer: true, ..Default::default() };
        c.setattr(creds, fid, set).await.unwrap();
    }
    c.write(&f, 0, Bytes::copy_from_slice(data)).await.unwrap();
    c.flush(&f).await.unwrap();
    c.close(f).await.unwrap();
}

/// The whole file as an open for reading by `fid` then a read from 0 give it.
async fn read_whole(c: &Client, creds: &Creds, fid: Fid) -> Vec<u8> {
    let (f, attr) = c.open_to_read(creds, fid, RO, None).await.unwrap();
    let data = c.read(&f, 0, attr.size.max(1 << 20)).await.unwrap();
    c.close(f).await.unwrap();
    data.to_vec()
}

#[test]
fn a_small_files_bytes_read_beside_its_open_are_what_the_last_close_left() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let writer = c.connect(&rt);
    let reader = c.connect(&rt);
    let dir = within(&rt, "mkdir", writer.mkdir(&creds, Fid::ROOT, "d", 0o755)).unwrap().fid;
    // Small files of several sizes (one past a 64 KiB step, one at the largest read
    // with its open), one too large for it and one empty.
    let sizes = [1usize, 3000, 65_536, 70_000, 128 << 10, (128 << 10) + 1, 0];
    let fids: Vec<Fid> = within(&rt, "writes", async {
        let mut fids = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            fids.push(put(&writer, &creds, dir, &format!("f{i}"), &testkit::pattern(n, i as u64)).await);
        }
        fids
    });

    // The reader is told each file's layout and size, then the writer changes
    // some: each open must find what the writer's close left, not what was told.
    within(&rt, "lookups", async {
        for i in 0..sizes.len() {
            reader.lookup(&creds, dir, &format!("f{i}")).await.unwrap();
        }
    });
    let mut now: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| testkit::pattern(n, i as u64)).collect();
    within(&rt, "rewrites", async {
        now[1] = testkit::pattern(3000, 101); // same size, other bytes
        rewrite(&writer, &creds, fids[1], &now[1], false).await;
        now[2] = testkit::pattern(100_000, 102); // grown, still small
        rewrite(&writer, &creds, fids[2], &now[2], false).await;
        now[3] = testkit::pattern(10, 103); // cut short
        rewrite(&writer, &creds, fids[3], &now[3], true).await;
    });
    for (i, fid) in fids.iter().enumerate() {
        let got = within(&rt, "read", read_whole(&reader, &creds, *fid));
        assert!(got == now[i], "f{i}: {} bytes read, {} expected", got.len(), now[i].len());
    }
    // f0, f1 and f4 (as told) and f3 (told 70,000 bytes, now 10) were read beside
    // their opens; f2 grew past the 64 KiB read the hint asked for, f5 is too large,
    // f6 empty.
    assert_eq!(reader.first_bytes_kept(), 4, "opens whose bytes came beside them");

    // A write of this client still on its way when the open is sent: the open reads
    // nothing beside itself, and the read sees the write.
    within(&rt, "own write", async {
        reader.lookup(&creds, dir, "f0").await.unwrap();
        let (w, _) = reader.open(&creds, fids[0], RW).await.unwrap();
        reader.write(&w, 0, Bytes::from_static(b"Z")).await.unwrap();
        let got = read_whole(&reader, &creds, fids[0]).await;
        assert_eq!(got, b"Z", "this client's write, read back through another handle");
        reader.close(w).await.unwrap();
    });
    assert_eq!(reader.first_bytes_kept(), 4, "no bytes read beside an open while a write was open here");
}

#[test]
fn bytes_are_read_beside_an_open_only_when_the_pages_held_are_of_another_version() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let writer = c.connect(&rt);
    let reader = c.connect(&rt);
    within(&rt, "opens", async {
        let fid = put(&writer, &creds, Fid::ROOT, "f", &testkit::pattern(5000, 1)).await;
        let told = reader.lookup(&creds, Fid::ROOT, "f").await.unwrap();
        // The caller holds the file's pages at the version it was told: they serve
        // its reads, nothing is read beside the open.
        let (f, attr) = reader.open_to_read(&creds, fid, RO, Some(told.data_version)).await.unwrap();
        assert_eq!(attr.data_version, told.data_version);
        reader.close(f).await.unwrap();
        assert_eq!(reader.first_bytes_kept(), 0, "pages held at the version told");
        // Rewritten since the caller filled its pages (as a mount that wrote the file
        // itself holds pages of the version before its close): read beside the open.
        let now = testkit::pattern(5000, 2);
        rewrite(&writer, &creds, fid, &now, false).await;
        let told = reader.lookup(&creds, Fid::ROOT, "f").await.unwrap();
        let (f, attr) = reader.open_to_read(&creds, fid, RO, Some(told.data_version - 1)).await.unwrap();
        let got = reader.read(&f, 0, 1 << 20).await.unwrap();
        reader.close(f).await.unwrap();
        assert_eq!(attr.size, 5000);
        assert!(got.as_ref() == now.as_slice(), "the bytes the last close left");
        assert_eq!(reader.first_bytes_kept(), 1, "pages held at an older version");
    });
}

#[test]
fn an_open_that_finds_no_extended_attributes_answers_the_listing_that_follows() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let a = c.connect(&rt);
    let b = c.connect(&rt);
    within(&rt, "xattrs", async {
        let plain = put(&a, &creds, Fid::ROOT, "plain", b"x").await;
        let tagged = put(&a, &creds, Fid::ROOT, "tagged", b"y").await;
        a.setxattr(&creds, tagged, "user.k", b"v", XattrMode::Any).await.unwrap();

        // The listing after an open of a file without any is answered here.
        let (f, _) = b.open(&creds, plain, RO).await.unwrap();
        let asked = b.rpc_counts().mds;
        assert!(b.listxattr(&creds, plain).await.unwrap().is_empty());
        assert_eq!(b.rpc_counts().mds, asked, "no request for the listing");
        b.close(f).await.unwrap();
        // One with attributes is listed by the MDS.
        let (f, _) = b.open(&creds, tagged, RO).await.unwrap();
        assert_eq!(b.listxattr(&creds, tagged).await.unwrap(), vec!["user.k".to_string()]);
        b.close(f).await.unwrap();

        // This client's own change is seen at once.
        let (f, _) = b.open(&creds, plain, RO).await.unwrap();
        b.setxattr(&creds, plain, "user.mine", b"1", XattrMode::Any).await.unwrap();
        assert_eq!(b.listxattr(&creds, plain).await.unwrap(), vec!["user.mine".to_string()]);
        b.close(f).await.unwrap();

        // Another client's, at the next open (or within a second: see `xattrless`).
        let other = put(&a, &creds, Fid::ROOT, "other", b"z").await;
        let (f, _) = b.open(&creds, other, RO).await.unwrap();
        assert!(b.listxattr(&creds, other).await.unwrap().is_empty());
        b.close(f).await.unwrap();
        a.setxattr(&creds, other, "user.late", b"2", XattrMode::Any).await.unwrap();
        let (f, _) = b.open(&creds, other, RO).await.unwrap();
        assert_eq!(b.listxattr(&creds, other).await.unwrap(), vec!["user.late".to_string()]);
        b.close(f).await.unwrap();
    });
}
