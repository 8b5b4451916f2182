//! Progressive file layouts through real server processes: composite layouts from the
//! CLI, components instantiated on demand by writes and truncates (also when two
//! clients race, and when one holds an older layout), component add/del, the seed's
//! Table 4 as a template and as the file system default, an instantiation across a
//! SIGKILL of the MDS, and the same through a FUSE mount.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use layout::{Layout, LayoutChange, EOF};
use proto::msg::{OpenFlags, SetAttr};
use proto::{Errno, Fid};
use testkit::{client_errno, field, pattern, runtime, stderr, within, Cluster, ClusterSpec, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const MIB: u64 = 1 << 20;
const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };
const RO: OpenFlags = OpenFlags { read: true, write: false, truncate: false };

/// `lcme_flags` of each component, in order, from `getstripe` output.
fn flags(getstripe: &str) -> Vec<String> {
    getstripe.lines().filter_map(|l| l.trim().strip_prefix("lcme_flags:").map(|f| f.trim().to_string())).collect()
}

fn layout_gen(getstripe: &str) -> u32 {
    field(getstripe, "lcm_layout_gen").expect("lcm_layout_gen").parse().expect("a number")
}

/// Which components have objects.
fn instantiated(l: &Layout) -> Vec<bool> {
    l.components.iter().map(|c| c.is_instantiated()).collect()
}

#[test]
fn composite_layouts_are_instantiated_as_the_file_grows() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, testkit::WAIT);
    let f = c.url("/pfl");
    c.braid_ok(&["setstripe", "-E", "4M", "-c", "1", "-S", "1M", "-E", "512M", "-c", "2", "-E", "-1", "-c", "4", &f]);
    let gs = c.braid_ok(&["getstripe", &f]);
    assert_eq!(flags(&gs), ["init", "0", "0"], "only the first component has objects at create:\n{gs}");
    assert_eq!(layout_gen(&gs), 1);
    assert!(gs.contains("lcme_extent.e_end:   EOF") && gs.contains("lmm_layout_gen:    65535"), "{gs}");
    assert_eq!(c.braid_ok(&["getstripe", "--component-count", &f]).trim(), "3");
    assert_eq!(c.braid_ok(&["getstripe", "-I", "3", "-c", &f]).trim(), "4");

    let rt = runtime();
    let a = c.connect(&rt);
    let b = c.connect(&rt);
    let creds = client::process_creds();
    let fid: Fid = within(&rt, "resolve", a.resolve(&creds, "/pfl", true)).expect("resolve").fid;
    let head = Bytes::from(pattern(MIB as usize, 1));
    let mid = Bytes::from(pattern(MIB as usize, 2));
    let mid2 = Bytes::from(pattern(MIB as usize, 3));
    within(&rt, "writes", async {
        let (fa, _) = a.open(&creds, fid, RW).await.expect("open a");
        // B opens now, holding the layout of generation 1.
        let (fb, _) = b.open(&creds, fid, RW).await.expect("open b");
        a.write(&fa, 0, head.clone()).await.expect("write in component 1");
        assert_eq!(fa.layout().generation, 1, "a write inside component 1 changes nothing");
        a.write(&fa, 5 * MIB, mid.clone()).await.expect("write in component 2");
        let la = fa.layout();
        assert_eq!((la.generation, instantiated(&la)), (2, vec![true, true, false]));
        // B's layout is older: its write there takes A's instantiation, not a new one.
        assert_eq!(fb.layout().generation, 1);
        b.write(&fb, 6 * MIB, mid2.clone()).await.expect("b writes in component 2");
        assert_eq!(*fb.layout(), *la, "B took the layout A's write made");
        a.close(fa).await.expect("close a");
        b.close(fb).await.expect("close b");
    });
    let attr = within(&rt, "getattr", a.getattr(fid)).expect("getattr");
    assert_eq!(attr.size, 7 * MIB);
    let (fa, _) = within(&rt, "reopen", a.open(&creds, fid, RW)).expect("reopen");
    let all = within(&rt, "read", a.read(&fa, 0, 7 * MIB)).expect("read");
    assert_eq!(&all[..MIB as usize], &head[..]);
    assert!(all[MIB as usize..5 * MIB as usize].iter().all(|&x| x == 0), "the gap reads as zeros");
    assert_eq!(&all[5 * MIB as usize..6 * MIB as usize], &mid[..]);
    assert_eq!(&all[6 * MIB as usize..], &mid2[..]);

    // Two clients racing into component 3: one instantiation, one layout for both.
    let (f1, _) = within(&rt, "open", a.open(&creds, fid, RW)).expect("open");
    let (f2, _) = within(&rt, "open", b.open(&creds, fid, RW)).expect("open");
    let (w1, w2) = within(&rt, "racing writes", async {
        tokio::join!(
            a.write(&f1, 600 * MIB, Bytes::from_static(b"one")),
            b.write(&f2, 700 * MIB, Bytes::from_static(b"two"))
        )
    });
    w1.expect("a's racing write");
    w2.expect("b's racing write");
    let now = within(&rt, "getattr", a.getattr(fid)).expect("getattr").layout.expect("layout");
    assert_eq!((now.generation, instantiated(&now)), (3, vec![true, true, true]), "{now:?}");
    assert_eq!(*f1.layout(), now);
    assert_eq!(*f2.layout(), now);
    assert_eq!(now.components[2].osts.len(), 4);
    within(&rt, "close", async {
        a.close(f1).await.expect("close");
        b.close(f2).await.expect("close");
    });
    let gs = c.braid_ok(&["getstripe", &f]);
    assert_eq!((flags(&gs), layout_gen(&gs)), (vec!["init".to_string(); 3], 3), "{gs}");
    within(&rt, "close", a.close(fa)).expect("close");

    // A reader holding an older layout refreshes it before reading where it has no
    // objects: a second file, B writes into its component 2 while A holds generation 1.
    c.braid_ok(&["setstripe", "-E", "4M", "-c", "1", "-E", "-1", "-c", "2", &c.url("/pfl2")]);
    let fid2 = within(&rt, "resolve", a.resolve(&creds, "/pfl2", true)).expect("resolve").fid;
    let (fa, _) = within(&rt, "open", a.open(&creds, fid2, RO)).expect("A opens");
    assert_eq!(fa.layout().generation, 1);
    within(&rt, "B writes", async {
        let (fb, _) = b.open(&creds, fid2, RW).await?;
        b.write(&fb, 5 * MIB, mid.clone()).await?;
        b.close(fb).await
    })
    .expect("B's write past 4 MiB");
    fa.set_size(6 * MIB); // as the mount does when the kernel learns the new size
    let got = within(&rt, "A reads", a.read(&fa, 5 * MIB, MIB)).expect("read");
    assert_eq!(got, mid, "A read B's bytes, not a hole");
    assert_eq!(fa.layout().generation, 2, "A took the newer layout");
    within(&rt, "close", a.close(fa)).expect("close");
}

#[test]
fn component_changes_truncates_and_bad_layouts() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, testkit::WAIT);
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();

    // A layout that ends at 2 MiB: a write past it fails with ENODATA (as Lustre's).
    let short = c.url("/short");
    c.braid_ok(&["setstripe", "-E", "1M", "-c", "1", "-E", "2M", "-c", "2", &short]);
    let fid = within(&rt, "resolve", cl.resolve(&creds, "/short", true)).expect("resolve").fid;
    let (f, _) = within(&rt, "open", cl.open(&creds, fid, RW)).expect("open");
    let past = within(&rt, "write past the end", cl.write(&f, 2 * MIB, Bytes::from_static(b"x")));
    assert_eq!(client_errno(past), Errno::NoData);
    // --component-add makes room; the write then succeeds.
    c.braid_ok(&["setstripe", "--component-add", "-E", "-1", "-c", "4", &short]);
    let gs = c.braid_ok(&["getstripe", &short]);
    assert_eq!(flags(&gs), ["init", "0", "0"], "{gs}");
    within(&rt, "write", cl.write(&f, 3 * MIB, Bytes::from_static(b"xyz"))).expect("write after the add");
    let gs = c.braid_ok(&["getstripe", &short]);
    assert_eq!(flags(&gs), ["init", "init", "init"], "{gs}");
    // Nothing uninstantiated is left to delete, and an instantiated one cannot go.
    for args in [vec!["--component-del"], vec!["--component-del", "-I", "3"]] {
        let mut all = vec!["setstripe"];
        all.extend(args);
        all.push(&short);
        let out = c.braid(&all);
        assert!(!out.status.success(), "{all:?} deleted an instantiated component");
    }
    assert_eq!(c.braid_ok(&["getstripe", "--component-count", &short]).trim(), "3");
    within(&rt, "close", cl.close(f)).expect("close");

    // Deleting trailing uninstantiated components, by id.
    let grown = c.url("/grown");
    c.braid_ok(&["setstripe", "-E", "1M", "-E", "4M", "-c", "2", "-E", "-1", "-c", "3", &grown]);
    c.braid_ok(&["setstripe", "--component-del", "-I", "2", &grown]);
    assert_eq!(c.braid_ok(&["getstripe", "--component-count", &grown]).trim(), "1");
    let out = c.braid(&["setstripe", "--component-add", "-E", "-1", "-c", "5", &grown]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Instantiating needs write permission, the file open, or ownership: another user
    // without them is refused; the owner may.
    let gfid = within(&rt, "resolve", cl.resolve(&creds, "/grown", true)).expect("resolve").fid;
    let nobody = proto::msg::Creds { uid: 65534, gid: 65534, groups: vec![] };
    let grow = LayoutChange::Instantiate { end: 2 * MIB };
    let refused = within(&rt, "instantiate as another user", cl.change_layout(&nobody, gfid, grow.clone()));
    assert_eq!(client_errno(refused), Errno::Access);
    let a = within(&rt, "instantiate as the owner", cl.change_layout(&creds, gfid, grow)).expect("instantiate");
    assert_eq!(instantiated(&a.layout.expect("layout")), [true, true]);

    // A truncate up into a component instantiates it (and the ones before it).
    let t = c.url("/trunc");
    c.braid_ok(&["setstripe", "--template", "seed-table4", &t]);
    let tfid = within(&rt, "resolve", cl.resolve(&creds, "/trunc", true)).expect("resolve").fid;
    let set = SetAttr { size: Some(600 * MIB), ..Default::default() };
    let attr = within(&rt, "truncate", cl.setattr(&creds, tfid, set)).expect("truncate up");
    assert_eq!(attr.size, 600 * MIB);
    let l = attr.layout.expect("layout");
    assert_eq!(instantiated(&l), [true, true, true, false, false, false]);
    assert_eq!(l.components.iter().map(|c| c.osts.len()).collect::<Vec<_>>(), [1, 2, 4, 0, 0, 0]);
    assert_eq!(l.components.last().map(|c| c.extent_end), Some(EOF));

    // Impossible layouts: a clear error naming the component, and no file.
    let bad: [(&[&str], &str); 4] = [
        (&["-E", "4M", "-c", "1", "-E", "2M", "-E", "-1"], "component 2"),
        (&["-E", "4M", "-E", "4100K", "-E", "-1"], "component 2"),
        (&["-E", "1M", "-c", "1", "-E", "-1", "-S", "100K"], "component 2"),
        (&["-E", "1M", "-c", "1", "-E", "2M", "-L", "mdt", "-E", "-1"], "must be the first"),
    ];
    for (args, says) in bad {
        let mut all = vec!["setstripe"];
        all.extend_from_slice(args);
        let url = c.url("/bad");
        all.push(&url);
        let out = c.braid(&all);
        assert!(!out.status.success() && stderr(&out).contains(says), "{all:?}: {}", stderr(&out));
        let gone = within(&rt, "resolve", cl.resolve(&creds, "/bad", true));
        assert_eq!(client_errno(gone), Errno::NoEnt, "{all:?} made a file");
    }
}

/// A handle whose layout predates another client's instantiation truncates and
/// punches the components that client instantiated too: no old bytes come back.
#[test]
fn cuts_through_an_older_layout_reach_components_instantiated_elsewhere() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, testkit::WAIT);
    let rt = runtime();
    let (a, b) = (c.connect(&rt), c.connect(&rt));
    let creds = client::process_creds();
    let mid = Bytes::from(pattern(MIB as usize, 7));
    for (name, cut) in [("/t", "truncate"), ("/p", "punch")] {
        c.braid_ok(&["setstripe", "-E", "4M", "-c", "1", "-E", "-1", "-c", "2", &c.url(name)]);
        let fid = within(&rt, "resolve", a.resolve(&creds, name, true)).expect("resolve").fid;
        let back = within(&rt, cut, async {
            let (fa, _) = a.open(&creds, fid, RW).await?;
            assert_eq!(fa.layout().generation, 1);
            // B instantiates component 2 and writes there; A's layout is older.
            let (fb, _) = b.open(&creds, fid, RW).await?;
            b.write(&fb, 5 * MIB, mid.clone()).await?;
            b.close(fb).await?;
            fa.set_size(6 * MIB);
            if cut == "truncate" {
                a.ftruncate(&creds, &fa, MIB).await?;
                a.ftruncate(&creds, &fa, 6 * MIB).await?;
            } else {
                a.punch_hole(&fa, 5 * MIB, MIB).await?;
            }
            a.close(fa).await?;
            let (fr, _) = b.open(&creds, fid, RO).await?;
            let back = b.read(&fr, 5 * MIB, MIB).await;
            b.close(fr).await?;
            back
        })
        .expect(cut);
        assert_eq!(back.len() as u64, MIB, "{cut}");
        assert!(back.iter().all(|&x| x == 0), "{cut} through an older layout left B's bytes behind");
    }
}

#[test]
fn an_instantiation_survives_a_sigkill_of_the_mds() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, testkit::WAIT);
    let f = c.url("/crash");
    c.braid_ok(&["setstripe", "-E", "4M", "-c", "1", "-E", "64M", "-c", "2", "-E", "-1", "-c", "4", &f]);
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let fid = within(&rt, "resolve", cl.resolve(&creds, "/crash", true)).expect("resolve").fid;
    let data = Bytes::from(pattern(MIB as usize, 7));
    let (fh, _) = within(&rt, "open", cl.open(&creds, fid, RW)).expect("open");
    within(&rt, "write", cl.write(&fh, 8 * MIB, data.clone())).expect("write into component 2");
    within(&rt, "fsync", cl.fsync(&fh)).expect("fsync");
    let before = fh.layout();
    c.kill("mds");
    c.restart("mds");
    let after = within(&rt, "getattr", cl.getattr(fid)).expect("getattr after restart").layout.expect("layout");
    assert_eq!(after, *before, "the acknowledged instantiation is kept as it was");

    // The MDS killed while a write needs an instantiation: the client asks again
    // after the restart, and the file comes out with one consistent layout.
    let writer = {
        let (cl, data) = (cl.clone(), data.clone());
        rt.spawn(async move {
            let r = cl.write(&fh, 100 * MIB, data).await;
            (r, fh)
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    c.kill("mds");
    c.restart("mds");
    let (r, fh) = within(&rt, "the write across the restart", writer).expect("join");
    r.expect("the write completes once the MDS is back");
    within(&rt, "fsync", cl.fsync(&fh)).expect("fsync");
    let l = within(&rt, "getattr", cl.getattr(fid)).expect("getattr").layout.expect("layout");
    assert_eq!((l.generation, instantiated(&l)), (3, vec![true, true, true]), "{l:?}");
    assert_eq!(*fh.layout(), l);
    let back = within(&rt, "read", cl.read(&fh, 100 * MIB, MIB)).expect("read");
    assert_eq!(back, data);
    within(&rt, "close", cl.close(fh)).expect("close");
}

#[test]
fn table4_default_and_a_pfl_directory_through_the_mount() {
    let spec = ClusterSpec { mds_args: vec!["--default-layout".into(), "seed-table4".into()], ..Default::default() };
    let c = Cluster::start(bin(), spec);
    c.wait_placement(4, testkit::WAIT);
    let m = Mount::new(&c, "");
    let s = |p: &Path| p.to_string_lossy().into_owned();

    // The file system default is Table 4: a new file at the root gets its six
    // components, one of them instantiated.
    std::fs::write(m.path("plain"), b"hello").expect("write");
    let gs = c.braid_ok(&["getstripe", &s(&m.path("plain"))]);
    assert_eq!(flags(&gs), ["init", "0", "0", "0", "0", "0"], "{gs}");

    // A directory with a PFL default: files grow into their components through FUSE.
    std::fs::create_dir(m.path("d")).expect("mkdir");
    c.braid_ok(&["setstripe", "-E", "1M", "-c", "1", "-E", "8M", "-c", "2", "-E", "-1", "-c", "4", &s(&m.path("d"))]);
    let d = c.braid_ok(&["getstripe", "-d", &s(&m.path("d"))]);
    assert_eq!(field(&d, "lcm_entry_count"), Some("3"), "{d}");
    let data = pattern(6 * MIB as usize, 11);
    std::fs::write(m.path("d/f"), &data).expect("write 6 MiB");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), data);
    let gs = c.braid_ok(&["getstripe", &s(&m.path("d/f"))]);
    assert_eq!((flags(&gs), layout_gen(&gs)), (vec!["init".into(), "init".into(), "0".into()], 2), "{gs}");
    let file = std::fs::OpenOptions::new().write(true).open(m.path("d/f")).expect("open");
    file.set_len(20 * MIB).expect("truncate up into component 3");
    drop(file);
    let gs = c.braid_ok(&["getstripe", &s(&m.path("d/f"))]);
    assert_eq!(flags(&gs), ["init", "init", "init"], "{gs}");
    let back = std::fs::read(m.path("d/f")).expect("read");
    assert_eq!(back.len(), 20 * MIB as usize);
    assert_eq!(&back[..data.len()], &data[..]);
    assert!(back[data.len()..].iter().all(|&x| x == 0));
    // Small files never reach their later components.
    for i in 0..20 {
        std::fs::write(m.path(&format!("d/small{i}")), b"x").expect("small file");
    }
    let gs = c.braid_ok(&["getstripe", &s(&m.path("d/small7"))]);
    assert_eq!(flags(&gs), ["init", "0", "0"], "{gs}");
}
