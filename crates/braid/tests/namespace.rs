//! Namespace rules through the native client against a cluster inside the test
//! process (no root, no FUSE, no child processes): rename in all its forms, setattr's
//! permission rules and truncate epochs, and the errnos of unlink and rmdir. Each
//! check names the exact errno or result POSIX asks for; the same rules are checked
//! through a real mount in `mount_posix.rs` and `mount_perms.rs`.

use client::Client;
use proto::msg::{Attr, Creds, FileKind, OpenFlags, RenameFlags, SetAttr};
use proto::{Errno, Fid};
use testkit::{client_errno, InProcessCluster};

const NONE: RenameFlags = RenameFlags { noreplace: false, exchange: false };
const NOREPLACE: RenameFlags = RenameFlags { noreplace: true, exchange: false };
const EXCHANGE: RenameFlags = RenameFlags { noreplace: false, exchange: true };

fn root() -> Creds {
    Creds::root()
}

/// An unprivileged user, alone in group 1000.
fn user(uid: u32) -> Creds {
    Creds { uid, gid: 1000, groups: vec![] }
}

/// Creates an empty file `name` in `parent` as `creds` and closes it.
async fn touch(c: &Client, creds: &Creds, parent: Fid, name: &str) -> Attr {
    let rw = OpenFlags { read: true, write: true, truncate: false };
    let (f, a, _) = c.create(creds, parent, name, 0o644, true, rw, None).await.expect("create");
    c.close(f).await.expect("close");
    a
}

/// The FID `name` in `parent` names, or the errno of looking it up.
async fn fid_of(c: &Client, parent: Fid, name: &str) -> Result<Fid, Errno> {
    c.lookup(&root(), parent, name).await.map(|a| a.fid).map_err(|e| e.errno())
}

#[test]
fn rename_over_a_file_replaces_it_and_the_old_name_is_gone() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let a = touch(c, &root(), Fid::ROOT, "a").await;
        let b = touch(c, &root(), Fid::ROOT, "b").await;
        assert_ne!(a.fid, b.fid);
        c.rename(&root(), Fid::ROOT, "a", Fid::ROOT, "b", NONE).await.expect("rename a over b");
        assert_eq!(fid_of(c, Fid::ROOT, "b").await, Ok(a.fid));
        assert_eq!(fid_of(c, Fid::ROOT, "a").await, Err(Errno::NoEnt));
        // The replaced file lost its only link (its inode stays a while as an orphan,
        // for handles still open on it).
        assert_eq!(c.getattr(b.fid).await.unwrap().nlink, 0);
        assert_eq!(c.getattr(a.fid).await.unwrap().nlink, 1);
        // A missing source.
        let r = c.rename(&root(), Fid::ROOT, "a", Fid::ROOT, "c", NONE).await;
        assert_eq!(client_errno(r), Errno::NoEnt);
    });
}

#[test]
fn rename_of_directories_over_directories_and_files() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let d = c.mkdir(&root(), Fid::ROOT, "d", 0o755).await.unwrap();
        let empty = c.mkdir(&root(), Fid::ROOT, "empty", 0o755).await.unwrap();
        let full = c.mkdir(&root(), Fid::ROOT, "full", 0o755).await.unwrap();
        touch(c, &root(), full.fid, "f").await;
        touch(c, &root(), Fid::ROOT, "file").await;

        let r = c.rename(&root(), Fid::ROOT, "d", Fid::ROOT, "full", NONE).await;
        assert_eq!(client_errno(r), Errno::NotEmpty, "a directory over a non-empty one");
        let r = c.rename(&root(), Fid::ROOT, "d", Fid::ROOT, "file", NONE).await;
        assert_eq!(client_errno(r), Errno::NotDir, "a directory over a file");
        let r = c.rename(&root(), Fid::ROOT, "file", Fid::ROOT, "empty", NONE).await;
        assert_eq!(client_errno(r), Errno::IsDir, "a file over a directory");
        assert_eq!(fid_of(c, Fid::ROOT, "d").await, Ok(d.fid), "failed renames change nothing");

        c.rename(&root(), Fid::ROOT, "d", Fid::ROOT, "empty", NONE).await.expect("over an empty directory");
        assert_eq!(fid_of(c, Fid::ROOT, "empty").await, Ok(d.fid));
        assert_eq!(fid_of(c, Fid::ROOT, "d").await, Err(Errno::NoEnt));
        assert_eq!(client_errno(c.getattr(empty.fid).await), Errno::NoEnt);
    });
}

#[test]
fn a_directory_cannot_move_into_its_own_subtree() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let d = c.mkdir(&root(), Fid::ROOT, "d", 0o755).await.unwrap();
        let sub = c.mkdir(&root(), d.fid, "sub", 0o755).await.unwrap();
        let deep = c.mkdir(&root(), sub.fid, "deep", 0o755).await.unwrap();
        for (parent, what) in [(d.fid, "itself"), (sub.fid, "its child"), (deep.fid, "its grandchild")] {
            let r = c.rename(&root(), Fid::ROOT, "d", parent, "x", NONE).await;
            assert_eq!(client_errno(r), Errno::Inval, "d into {what}");
        }
        assert_eq!(fid_of(c, Fid::ROOT, "d").await, Ok(d.fid));
        // Out of its own subtree is fine.
        c.rename(&root(), sub.fid, "deep", Fid::ROOT, "deep", NONE).await.expect("deep up to the root");
        assert_eq!(c.getattr(d.fid).await.unwrap().nlink, 3, "d keeps . , its entry and sub's ..");
        assert_eq!(c.getattr(sub.fid).await.unwrap().nlink, 2, "sub lost deep's ..");
    });
}

#[test]
fn rename_noreplace_and_exchange() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let a = touch(c, &root(), Fid::ROOT, "a").await;
        let b = touch(c, &root(), Fid::ROOT, "b").await;
        let d = c.mkdir(&root(), Fid::ROOT, "d", 0o755).await.unwrap();

        let r = c.rename(&root(), Fid::ROOT, "a", Fid::ROOT, "b", NOREPLACE).await;
        assert_eq!(client_errno(r), Errno::Exist);
        assert_eq!(fid_of(c, Fid::ROOT, "a").await, Ok(a.fid));
        assert_eq!(fid_of(c, Fid::ROOT, "b").await, Ok(b.fid));
        c.rename(&root(), Fid::ROOT, "a", Fid::ROOT, "free", NOREPLACE).await.expect("noreplace to a free name");
        assert_eq!(fid_of(c, Fid::ROOT, "free").await, Ok(a.fid));

        // Exchange swaps the two names, a file and a directory in different parents too.
        c.rename(&root(), Fid::ROOT, "free", Fid::ROOT, "b", EXCHANGE).await.expect("exchange two files");
        assert_eq!(fid_of(c, Fid::ROOT, "free").await, Ok(b.fid));
        assert_eq!(fid_of(c, Fid::ROOT, "b").await, Ok(a.fid));
        let inner = touch(c, &root(), d.fid, "inner").await;
        c.rename(&root(), Fid::ROOT, "b", d.fid, "inner", EXCHANGE).await.expect("exchange across directories");
        assert_eq!(fid_of(c, d.fid, "inner").await, Ok(a.fid));
        assert_eq!(fid_of(c, Fid::ROOT, "b").await, Ok(inner.fid));
        let r = c.rename(&root(), Fid::ROOT, "b", Fid::ROOT, "missing", EXCHANGE).await;
        assert_eq!(client_errno(r), Errno::NoEnt, "exchange needs both names");
    });
}

#[test]
fn chmod_and_chown_rules() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let open = c.mkdir(&root(), Fid::ROOT, "open", 0o777).await.unwrap();
        let f = touch(c, &user(1000), open.fid, "f").await;
        assert_eq!((f.uid, f.gid), (1000, 1000));
        let chmod = |m| SetAttr { mode: Some(m), ..Default::default() };

        // Only the owner (or root) changes the mode.
        assert_eq!(client_errno(c.setattr(&user(1001), f.fid, chmod(0o600)).await), Errno::Perm);
        assert_eq!(c.setattr(&user(1000), f.fid, chmod(0o600)).await.unwrap().mode, 0o600);
        assert_eq!(c.setattr(&root(), f.fid, chmod(0o640)).await.unwrap().mode, 0o640);

        // Only root changes the owner, even to the owner's own choice of another user.
        let chown = |u| SetAttr { uid: Some(u), ..Default::default() };
        assert_eq!(client_errno(c.setattr(&user(1000), f.fid, chown(1001)).await), Errno::Perm);
        // Setting the owner it already has is no change.
        assert_eq!(c.setattr(&user(1000), f.fid, chown(1000)).await.unwrap().uid, 1000);

        // The owner may give the file to a group they are in, and to no other.
        let chgrp = |g| SetAttr { gid: Some(g), ..Default::default() };
        let member = Creds { uid: 1000, gid: 1000, groups: vec![2000] };
        assert_eq!(c.setattr(&member, f.fid, chgrp(2000)).await.unwrap().gid, 2000);
        assert_eq!(client_errno(c.setattr(&member, f.fid, chgrp(3000)).await), Errno::Perm);
        assert_eq!(client_errno(c.setattr(&user(1001), f.fid, chgrp(1000)).await), Errno::Perm);

        // A change of owner drops set-user-id.
        assert_eq!(c.setattr(&root(), f.fid, chmod(0o4755)).await.unwrap().mode, 0o4755);
        let a = c.setattr(&root(), f.fid, chown(1001)).await.unwrap();
        assert_eq!((a.uid, a.mode), (1001, 0o755));
    });
}

#[test]
fn truncate_bumps_the_truncate_epoch_and_needs_write_permission() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let f = touch(c, &root(), Fid::ROOT, "f").await;
        let d = c.mkdir(&root(), Fid::ROOT, "d", 0o755).await.unwrap();
        let size = |s| SetAttr { size: Some(s), ..Default::default() };

        let a = c.setattr(&root(), f.fid, size(1000)).await.unwrap();
        assert_eq!((a.size, a.trunc_epoch), (1000, f.trunc_epoch + 1));
        let a = c.setattr(&root(), f.fid, size(10)).await.unwrap();
        assert_eq!((a.size, a.trunc_epoch), (10, f.trunc_epoch + 2));
        assert_eq!(c.getattr(f.fid).await.unwrap().trunc_epoch, f.trunc_epoch + 2);

        // 0644 root:root: another user may not write it, so may not truncate it.
        assert_eq!(client_errno(c.setattr(&user(1000), f.fid, size(0)).await), Errno::Access);
        assert_eq!(c.getattr(f.fid).await.unwrap().trunc_epoch, f.trunc_epoch + 2, "a refused truncate");
        assert_eq!(client_errno(c.setattr(&root(), d.fid, size(0)).await), Errno::IsDir);
    });
}

#[test]
fn unlink_and_rmdir_errnos() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let d = c.mkdir(&root(), Fid::ROOT, "d", 0o755).await.unwrap();
        touch(c, &root(), d.fid, "f").await;
        touch(c, &root(), Fid::ROOT, "file").await;

        assert_eq!(client_errno(c.unlink(&root(), Fid::ROOT, "d").await), Errno::IsDir);
        assert_eq!(client_errno(c.rmdir(&root(), Fid::ROOT, "file").await), Errno::NotDir);
        assert_eq!(client_errno(c.rmdir(&root(), Fid::ROOT, "d").await), Errno::NotEmpty);
        assert_eq!(client_errno(c.unlink(&root(), Fid::ROOT, "missing").await), Errno::NoEnt);
        assert_eq!(client_errno(c.rmdir(&root(), Fid::ROOT, "missing").await), Errno::NoEnt);

        // Without write permission on the directory, nobody but root removes from it.
        assert_eq!(client_errno(c.unlink(&user(1000), d.fid, "f").await), Errno::Access);

        // In a sticky directory only the owner of the entry (or of the directory) may.
        let tmp = c.mkdir(&root(), Fid::ROOT, "tmp", 0o1777).await.unwrap();
        assert_eq!(tmp.mode, 0o1777);
        touch(c, &user(1000), tmp.fid, "mine").await;
        assert_eq!(client_errno(c.unlink(&user(1001), tmp.fid, "mine").await), Errno::Perm);
        c.unlink(&user(1000), tmp.fid, "mine").await.expect("the owner unlinks");

        c.unlink(&root(), d.fid, "f").await.unwrap();
        c.rmdir(&root(), Fid::ROOT, "d").await.expect("rmdir once empty");
        assert_eq!(fid_of(c, Fid::ROOT, "d").await, Err(Errno::NoEnt));
        let names: Vec<(String, FileKind)> =
            c.readdir_all(&root(), Fid::ROOT).await.unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
        assert_eq!(names, [("file".to_string(), FileKind::File), ("tmp".to_string(), FileKind::Dir)]);
    });
}

#[test]
fn xattrs_of_a_namespace_the_mds_does_not_keep_are_refused_here_without_a_request() {
    let k = InProcessCluster::start();
    let c = &k.client;
    k.run(async {
        let a = touch(c, &root(), Fid::ROOT, "f").await;
        let before = c.rpc_counts().mds;
        let acl = "system.posix_acl_access";
        assert_eq!(client_errno(c.getxattr(&root(), a.fid, acl).await), Errno::NotSup);
        let set = c.setxattr(&root(), a.fid, acl, b"v", proto::msg::XattrMode::Any).await;
        assert_eq!(client_errno(set), Errno::NotSup);
        assert_eq!(client_errno(c.removexattr(&root(), a.fid, "bogus.k").await), Errno::NotSup);
        assert_eq!(c.rpc_counts().mds, before, "answered without asking the MDS");
        // What the MDS keeps still goes to it, and so does a name only it may judge.
        c.setxattr(&root(), a.fid, "user.k", b"v", proto::msg::XattrMode::Any).await.unwrap();
        assert_eq!(client_errno(c.getxattr(&root(), a.fid, "").await), Errno::Range);
        assert_eq!(c.rpc_counts().mds, before + 2);
    });
}
