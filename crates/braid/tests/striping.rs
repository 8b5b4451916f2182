//! Data path and layouts through real MGS, MDS and OSS processes: striped files
//! byte for byte inside each OST's objects, layouts and their errors, `getstripe` and
//! `df` output, an OST added under a running client, files past 4 GiB, the destroy
//! queue, and `braid local` restarted on its own data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use layout::LayoutSpec;
use proto::msg::OpenFlags;
use proto::Fid;
use testkit::{
    field, free_port, getstripe_objects, output_within, pattern, runtime, stderr, stdout, wait_for, Cluster,
    ClusterSpec, Daemon, TempDir, WAIT,
};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

fn rw() -> OpenFlags {
    OpenFlags { read: true, write: true, truncate: false }
}

/// The `seq-oid-` prefix of a file's object names, from `braid stat`'s FID.
fn object_prefix(c: &Cluster, remote: &str) -> String {
    let st = c.braid_ok(&["stat", &c.url(remote)]);
    let fid = st
        .split_whitespace()
        .skip_while(|w| *w != "FID:")
        .nth(1)
        .unwrap_or_else(|| panic!("no FID in stat output:\n{st}"));
    let parts: Vec<&str> = fid.trim_matches(|ch| ch == '[' || ch == ']').split(':').collect();
    assert_eq!(parts.len(), 3, "FID {fid}");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex FID");
    format!("{:x}-{:x}-", hex(parts[0]), hex(parts[1]))
}

fn file_name(p: &Path) -> String {
    p.file_name().expect("object file name").to_string_lossy().into_owned()
}

/// Object files of the file whose names start with `prefix`, on every OST.
fn objects_of(c: &Cluster, osts: usize, prefix: &str) -> Vec<PathBuf> {
    (0..osts).flat_map(|i| c.ost_objects(i)).filter(|p| file_name(p).starts_with(prefix)).collect()
}

#[test]
fn striped_file_bytes_are_in_each_ost_object() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let stripe = 64 << 10;
    c.braid_ok(&["setstripe", "-c", "4", "-S", "64K", &c.url("/wide")]);
    // 16 full stripes and a short one: stripe 0 gets five pieces, the others four.
    let data = pattern(16 * stripe + 1000, 1);
    c.put("/wide", &data);
    assert_eq!(c.get("/wide"), data, "read back through the client");

    let gs = c.braid_ok(&["getstripe", &c.url("/wide")]);
    assert_eq!(field(&gs, "lmm_stripe_count"), Some("4"), "{gs}");
    assert_eq!(field(&gs, "lmm_stripe_size"), Some("65536"), "{gs}");
    let rows = getstripe_objects(&gs);
    assert_eq!(rows.len(), 4, "{gs}");
    let osts: BTreeSet<u32> = rows.iter().map(|r| r.0).collect();
    assert_eq!(osts, BTreeSet::from([0, 1, 2, 3]), "{gs}");

    for (k, &(ost, objid)) in rows.iter().enumerate() {
        let files = c.ost_objects(ost as usize);
        assert_eq!(files.len(), 1, "OST {ost} holds {files:?}");
        let name = file_name(&files[0]);
        let f: Vec<u64> = name.split('-').map(|h| u64::from_str_radix(h, 16).expect("hex object name")).collect();
        assert_eq!(f.len(), 5, "object name {name}");
        let (seq, oid, comp, stripe_index) = (f[0], f[1], f[3], f[4]);
        assert_eq!(stripe_index, k as u64, "stripe {k} is on OST {ost}: {name}");
        assert_eq!(
            objid,
            ((seq & 0xffff) << 48) | (oid << 16) | ((comp & 0xff) << 8) | stripe_index,
            "getstripe objid of {name}"
        );
        // RAID-0: the object holds stripes k, k+4, k+8, ... back to back.
        let expected: Vec<u8> = data.chunks(stripe).skip(k).step_by(4).flatten().copied().collect();
        let on_disk = std::fs::read(&files[0]).expect("read an object file");
        assert_eq!(on_disk.len(), expected.len(), "size of {name}");
        assert!(on_disk == expected, "bytes of {name} on OST {ost}");
    }
}

#[test]
fn setstripe_getstripe_and_directory_defaults() {
    let c = Cluster::start(bin(), ClusterSpec::default());

    c.braid_ok(&["setstripe", "-c", "2", "-i", "1", "-S", "1M", &c.url("/off")]);
    let gs = c.braid_ok(&["getstripe", &c.url("/off")]);
    assert_eq!(field(&gs, "lmm_stripe_count"), Some("2"), "{gs}");
    assert_eq!(field(&gs, "lmm_stripe_size"), Some("1048576"), "{gs}");
    assert_eq!(field(&gs, "lmm_pattern"), Some("raid0"), "{gs}");
    assert_eq!(field(&gs, "lmm_stripe_offset"), Some("1"), "{gs}");
    assert!(field(&gs, "lmm_layout_gen").is_some(), "{gs}");
    let osts: Vec<u32> = getstripe_objects(&gs).iter().map(|r| r.0).collect();
    assert_eq!(osts, vec![1, 2], "{gs}");

    c.braid_ok(&["setstripe", "-o", "3,0", &c.url("/list")]);
    let gs = c.braid_ok(&["getstripe", &c.url("/list")]);
    let osts: Vec<u32> = getstripe_objects(&gs).iter().map(|r| r.0).collect();
    assert_eq!(osts, vec![3, 0], "explicit list kept in order:\n{gs}");

    c.braid_ok(&["setstripe", "-c", "-1", &c.url("/all")]);
    let gs = c.braid_ok(&["getstripe", &c.url("/all")]);
    assert_eq!(field(&gs, "lmm_stripe_count"), Some("4"), "{gs}");

    // A directory default is inherited by files created in it.
    c.braid_ok(&["mkdir", &c.url("/d")]);
    c.braid_ok(&["setstripe", "-c", "3", "-S", "128K", &c.url("/d")]);
    let gd = c.braid_ok(&["getstripe", "-d", &c.url("/d")]);
    assert!(gd.contains("stripe_count:  3") && gd.contains("stripe_size:   131072"), "{gd}");
    let data = pattern(700 << 10, 2);
    c.put("/d/f", &data);
    assert_eq!(c.get("/d/f"), data);
    let gs = c.braid_ok(&["getstripe", &c.url("/d/f")]);
    assert_eq!(field(&gs, "lmm_stripe_count"), Some("3"), "{gs}");
    assert_eq!(field(&gs, "lmm_stripe_size"), Some("131072"), "{gs}");
    // getstripe of the directory shows the default and then each file's layout.
    let all = c.braid_ok(&["getstripe", &c.url("/d")]);
    assert!(all.contains("/d/f") && all.contains("lmm_stripe_count:  3"), "{all}");

    // Removing the default: new files fall back to the file system default (1 stripe).
    c.braid_ok(&["setstripe", "-d", &c.url("/d")]);
    c.put("/d/g", b"small");
    let gs = c.braid_ok(&["getstripe", &c.url("/d/g")]);
    assert_eq!(field(&gs, "lmm_stripe_count"), Some("1"), "{gs}");

    // A file's layout is fixed once it exists.
    let out = c.braid(&["setstripe", "-c", "2", &c.url("/all")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("file exists"), "{}", stderr(&out));
}

#[test]
fn impossible_layouts_give_clear_errors() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let cases: &[(&[&str], &str)] = &[
        (&["-S", "100K"], "not a multiple of 64 KiB"),
        (&["-S", "96K", "-c", "2"], "not a multiple of 64 KiB"),
        (&["-o", "9"], "OST index 9 does not exist"),
        (&["-o", "1,7"], "OST index 7 does not exist"),
        (&["-i", "9"], "OST index 9 does not exist"),
        (&["-c", "3", "-o", "0,1"], "larger than the explicit OST list"),
        (&["-c", "-2"], "stripe count -2 is invalid"),
        (&["-o", "1,1"], "appears twice"),
        (&["-S", "12Q"], "invalid size"),
    ];
    for (i, (flags, message)) in cases.iter().enumerate() {
        let name = format!("/bad{i}");
        let url = c.url(&name);
        let mut args = vec!["setstripe"];
        args.extend_from_slice(flags);
        args.push(&url);
        let out = c.braid(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: expected '{message}' in: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // No half-created file is left behind by a refused layout.
    let ls = c.braid_ok(&["ls", &c.url("/")]);
    assert!(!ls.contains("bad"), "{ls}");
    // A bad default on a directory is refused too, and the directory keeps none.
    c.braid_ok(&["mkdir", &c.url("/d")]);
    let out = c.braid(&["setstripe", "-S", "100K", &c.url("/d")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("64 KiB"), "{}", stderr(&out));
    let gd = c.braid_ok(&["getstripe", "-d", &c.url("/d")]);
    assert!(gd.contains("(inherited)"), "{gd}");
}

#[test]
fn df_shows_every_target_and_a_summary() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let mount = c.url("/");
    let df = c.braid_ok(&["df", &mount]);
    let lines: Vec<&str> = df.lines().collect();
    let head: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(head, ["UUID", "1K-blocks", "Used", "Available", "Use%", "Mounted", "on"], "{df}");
    let row = |tag: &str| -> Vec<u64> {
        let l = lines.iter().find(|l| l.ends_with(tag)).unwrap_or_else(|| panic!("no row ending in {tag}:\n{df}"));
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(cols.len(), 6, "{l}");
        assert!(cols[4].ends_with('%'), "{l}");
        cols[1..4].iter().map(|n| n.parse().unwrap_or_else(|_| panic!("number in {l}"))).collect()
    };
    assert!(df.contains("braid-MDT0000_UUID"), "{df}");
    row(&format!("{mount}[MDT:0]"));
    let mut total = 0;
    for i in 0..4 {
        assert!(df.contains(&format!("braid-OST{i:04x}_UUID")), "{df}");
        let r = row(&format!("{mount}[OST:{i}]"));
        assert!(r[0] > 0 && r[1] <= r[0] && r[2] <= r[0], "OST {i}: {r:?}");
        total += r[0];
    }
    let summary =
        lines.iter().find(|l| l.starts_with("filesystem_summary:")).unwrap_or_else(|| panic!("no summary line:\n{df}"));
    let cols: Vec<&str> = summary.split_whitespace().collect();
    assert_eq!(cols[1].parse::<u64>().ok(), Some(total), "{summary}");
    assert_eq!(cols.last(), Some(&mount.as_str()), "{summary}");

    let dfi = c.braid_ok(&["df", "-i", &mount]);
    assert!(dfi.lines().next().unwrap_or("").contains("Inodes"), "{dfi}");
    assert!(dfi.contains("filesystem_summary:"), "{dfi}");
    let dfh = c.braid_ok(&["df", "-h", &mount]);
    let ost_row = dfh.lines().find(|l| l.ends_with("[OST:0]")).unwrap_or_else(|| panic!("{dfh}"));
    assert!(
        ost_row.split_whitespace().nth(1).is_some_and(|s| s.chars().last().is_some_and(|u| u.is_ascii_alphabetic())),
        "human sizes carry a unit: {ost_row}"
    );
}

#[test]
fn ost_added_while_a_client_runs_is_used_for_new_files() {
    let mut c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![2], ..Default::default() });
    let rt = runtime();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let wide = || Some(LayoutSpec::raid0(Some(-1), Some(64 << 10)));
    let before = pattern(300 << 10, 3);
    let osts_before = rt.block_on(async {
        let (f, _, _) = client.create(&creds, Fid::ROOT, "before", 0o644, true, rw(), wide()).await?;
        client.write(&f, 0, Bytes::from(before.clone())).await?;
        let mut osts = f.layout().components[0].osts.clone();
        osts.sort();
        client.close(f).await?;
        client::Result::Ok(osts)
    });
    assert_eq!(osts_before.expect("write before"), vec![0, 1]);

    c.add_oss("oss1", &[c.ost_dir(2)]);
    c.wait_osts_up(3, WAIT);

    // The MDS learns of the OST from the MGS asynchronously: probe until a new
    // all-OST file spans it, with the same client that connected before it existed.
    let mut n = 0;
    wait_for("a new file striped over the added OST", WAIT, || {
        n += 1;
        let name = format!("probe{n}");
        let f = rt
            .block_on(client.create(&creds, Fid::ROOT, &name, 0o644, true, rw(), wide()))
            .expect("create a probe file")
            .0;
        let mut osts = f.layout().components[0].osts.clone();
        osts.sort();
        osts == [0, 1, 2]
    });
    let after = pattern(1 << 20, 4);
    let read = rt.block_on(async {
        let (f, _, _) = client.create(&creds, Fid::ROOT, "after", 0o644, true, rw(), wide()).await?;
        client.write(&f, 0, Bytes::from(after.clone())).await?;
        client.fsync(&f).await?;
        let back = client.read(&f, 0, after.len() as u64).await?;
        client.close(f).await?;
        client::Result::Ok(back)
    });
    assert!(read.expect("write after") == after);
    assert_eq!(c.get("/after"), after, "a fresh CLI client reads it too");
    assert_eq!(c.get("/before"), before);
    // One stripe of "after" lives on the new OST, with exactly that stripe's bytes.
    let prefix = object_prefix(&c, "/after");
    let objs: Vec<PathBuf> = c.ost_objects(2).into_iter().filter(|p| file_name(p).starts_with(&prefix)).collect();
    assert_eq!(objs.len(), 1, "{objs:?}");
    let name = file_name(&objs[0]);
    let stripe: usize = name.rsplit('-').next().and_then(|h| usize::from_str_radix(h, 16).ok()).expect("stripe");
    let expected: Vec<u8> = after.chunks(64 << 10).skip(stripe).step_by(3).flatten().copied().collect();
    assert!(std::fs::read(&objs[0]).expect("read object") == expected);
}

#[test]
fn sparse_file_past_4_gib_reads_holes_as_zeros() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let rt = runtime();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let at: u64 = 5 << 30;
    let spec = Some(LayoutSpec::raid0(Some(2), Some(1 << 20)));
    rt.block_on(async {
        let (f, _, _) = client.create(&creds, Fid::ROOT, "sparse", 0o644, true, rw(), spec).await?;
        client.write(&f, at, Bytes::from_static(b"braid")).await?;
        client.close(f).await
    })
    .expect("write at 5 GiB");

    let st = c.braid_ok(&["stat", &c.url("/sparse")]);
    assert!(st.contains(&format!("Size: {}", at + 5)), "{st}");
    let ls = c.braid_ok(&["ls", "-l", &c.url("/")]);
    assert!(ls.contains(&(at + 5).to_string()), "{ls}");

    let (tail, hole, head, past_end) = rt
        .block_on(async {
            let attr = client.lookup(&creds, Fid::ROOT, "sparse").await?;
            let ro = OpenFlags { read: true, write: false, truncate: false };
            let (f, _) = client.open(&creds, attr.fid, ro).await?;
            let tail = client.read(&f, at - 100, 200).await?;
            // Crosses the 4 GiB boundary inside a hole.
            let hole = client.read(&f, (4 << 30) - 4096, 8192).await?;
            let head = client.read(&f, 0, 64 << 10).await?;
            let past_end = client.read(&f, at + 5, 100).await?;
            client.close(f).await?;
            client::Result::Ok((tail, hole, head, past_end))
        })
        .expect("read the sparse file");
    assert_eq!(tail.len(), 105, "read is clamped at the file size");
    assert!(tail[..100].iter().all(|&b| b == 0), "hole before the data");
    assert_eq!(&tail[100..], b"braid");
    assert_eq!(hole.len(), 8192);
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(head.len(), 64 << 10);
    assert!(head.iter().all(|&b| b == 0));
    assert!(past_end.is_empty());

    // The OSTs store the object sparsely: 5 bytes, not gigabytes of zeros.
    use std::os::unix::fs::MetadataExt;
    let prefix = object_prefix(&c, "/sparse");
    let objs = objects_of(&c, 4, &prefix);
    assert!(!objs.is_empty());
    let (apparent, allocated) = objs.iter().fold((0, 0), |(a, b), p| {
        let m = std::fs::metadata(p).expect("object metadata");
        (a + m.len(), b + m.blocks() * 512)
    });
    assert!(apparent > 2 << 30, "objects span {apparent} bytes");
    assert!(allocated < 16 << 20, "objects allocate {allocated} bytes");
}

#[test]
fn deleted_files_leave_no_objects_once_the_destroy_queue_drains() {
    let mut c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![2, 2], ..Default::default() });
    for name in ["/a", "/b"] {
        c.braid_ok(&["setstripe", "-c", "4", "-S", "64K", &c.url(name)]);
        c.put(name, &pattern(512 << 10, 5));
    }
    let (pa, pb) = (object_prefix(&c, "/a"), object_prefix(&c, "/b"));
    assert_eq!(objects_of(&c, 4, &pa).len(), 4);
    assert_eq!(objects_of(&c, 4, &pb).len(), 4);

    c.braid_ok(&["rm", &c.url("/a")]);
    wait_for("the objects of /a to be destroyed", WAIT, || objects_of(&c, 4, &pa).is_empty());
    assert_eq!(objects_of(&c, 4, &pb).len(), 4, "/b is untouched");

    // Delete while half of the OSTs are down: their objects wait in the queue, and
    // the file is gone from the namespace at once.
    c.kill("oss1");
    c.braid_ok(&["rm", &c.url("/b")]);
    let ls = c.braid_ok(&["ls", &c.url("/")]);
    assert!(!ls.split_whitespace().any(|n| n == "b"), "{ls}");
    c.restart("oss1");
    wait_for("every object of /b to be destroyed", WAIT, || objects_of(&c, 4, &pb).is_empty());
    for i in 0..4 {
        assert!(c.ost_objects(i).is_empty(), "OST {i}: {:?}", c.ost_objects(i));
    }
}

/// Runs the CLI against a `braid local` cluster.
fn local_cli(data: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(args).env("BRAID_SECRET_FILE", data.join("cluster.secret"));
    output_within(&mut cmd, testkit::CLI_WATCHDOG).expect("braid finished")
}

fn local_ok(data: &Path, args: &[&str]) -> String {
    let out = local_cli(data, args);
    assert!(out.status.success(), "braid {args:?}: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

#[test]
fn local_cluster_started_again_on_its_directory_finds_its_data() {
    let dir = TempDir::new("local");
    let data = dir.path().join("data");
    let listen = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let url = |p: &str| format!("braid://{listen}{p}");
    let start = |n: u32| {
        let args = [
            "local",
            "--data",
            data.to_str().expect("utf-8 path"),
            "--listen",
            &listen,
            "--osts",
            "3",
            "--heartbeat-ms",
            "200",
            "--target-timeout-ms",
            "1500",
        ];
        Daemon::start(bin(), &args, &[], &dir.path().join(format!("local{n}.log")), "MGS at")
            .unwrap_or_else(|log| panic!("braid local did not start:\n{log}"))
    };
    // A new MDS learns the OSTs a heartbeat after they register (see the
    // `create_right_after_startup` test); wait for that before writing.
    let placing = || {
        let mut n = 0;
        wait_for("braid local to place files on its 3 OSTs", WAIT, || {
            n += 1;
            let probe = url(&format!("/probe{n}"));
            let out = local_cli(&data, &["setstripe", "-c", "-1", "--timeout-s", "1", &probe]);
            out.status.success()
                && getstripe_objects(&local_ok(&data, &["getstripe", &probe])).len() == 3
                && local_cli(&data, &["rm", &probe]).status.success()
        });
    };
    let put = |remote: &str, bytes: &[u8]| {
        let local = dir.path().join("upload");
        std::fs::write(&local, bytes).expect("write local file");
        local_ok(&data, &["cp", local.to_str().expect("utf-8"), &url(remote)]);
    };
    let get = |remote: &str| {
        let local = dir.path().join("download");
        let _ = std::fs::remove_file(&local);
        local_ok(&data, &["cp", &url(remote), local.to_str().expect("utf-8")]);
        std::fs::read(&local).expect("read download")
    };
    let (one, two) = (pattern(900 << 10, 6), pattern(70 << 10, 7));

    let mut d = start(1);
    placing();
    assert!(d.banner.iter().any(|l| l.contains(&listen)), "{:?}", d.banner);
    local_ok(&data, &["setstripe", "-c", "3", "-S", "64K", &url("/striped")]);
    put("/striped", &one);
    local_ok(&data, &["mkdir", &url("/dir")]);
    put("/dir/small", &two);
    let layout = local_ok(&data, &["getstripe", &url("/striped")]);
    d.kill(libc::SIGTERM);

    let mut d = start(2);
    placing();
    assert_eq!(get("/striped"), one);
    assert_eq!(get("/dir/small"), two);
    assert_eq!(local_ok(&data, &["getstripe", &url("/striped")]), layout, "same layout and objects after a restart");
    put("/dir/later", b"written by the second run");
    // This time the cluster dies without warning.
    d.kill(libc::SIGKILL);

    let _d = start(3);
    assert_eq!(get("/striped"), one);
    assert_eq!(get("/dir/later"), b"written by the second run");
    let ls = local_ok(&data, &["ls", &url("/dir")]);
    let names: Vec<&str> = ls.split_whitespace().collect();
    assert_eq!(names, ["later", "small"], "{ls}");
    let df = local_ok(&data, &["df", &url("/")]);
    assert_eq!(df.matches("[OST:").count(), 3, "{df}");
}

#[test]
fn readahead_is_dropped_when_the_file_is_truncated_by_fid() {
    // A handle reads ahead; the file is then emptied and grown again through setattr by
    // FID (as the mount's truncate does). The handle must read the zeros now there, not
    // the bytes it prefetched before.
    let c = Cluster::start(bin(), ClusterSpec::default());
    let rt = runtime();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let data = pattern(8 << 20, 7);
    rt.block_on(async {
        let spec = Some(LayoutSpec::raid0(Some(2), Some(1 << 20)));
        let (f, _, _) = client.create(&creds, Fid::ROOT, "ra", 0o644, true, rw(), spec).await?;
        client.write(&f, 0, Bytes::from(data.clone())).await?;
        client.fsync(&f).await?;
        // Two sequential reads start the read-ahead of the rest of the file.
        assert_eq!(&client.read(&f, 0, 64 << 10).await?[..], &data[..64 << 10]);
        assert_eq!(&client.read(&f, 64 << 10, 64 << 10).await?[..], &data[64 << 10..128 << 10]);
        for size in [0, 8 << 20] {
            let set = proto::msg::SetAttr { size: Some(size), ..Default::default() };
            client.setattr(&creds, f.fid, set).await?;
        }
        let after = client.read(&f, 128 << 10, 1 << 20).await?;
        assert!(after.iter().all(|&b| b == 0), "bytes read ahead before the truncate were served after it");
        client.close(f).await
    })
    .expect("read-ahead scenario");
}

#[test]
fn a_read_through_one_handle_sees_writes_just_made_through_another() {
    // Writes return once under way (write-behind); a read through another handle of the
    // same file in the same client must still see them, as POSIX reads see every write
    // that returned before them. Small reads are served faster than large writes, so
    // without waiting for the other handle's writes the read overtakes them.
    let c = Cluster::start(bin(), ClusterSpec::default());
    let rt = runtime();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    rt.block_on(async {
        let spec = Some(LayoutSpec::raid0(Some(2), Some(1 << 20)));
        let (a, _, _) = client.create(&creds, Fid::ROOT, "shared", 0o644, true, rw(), spec).await?;
        client.write(&a, 0, Bytes::from(vec![0u8; 4 << 20])).await?;
        client.flush(&a).await?;
        let (b, _) = client.open(&creds, a.fid, rw()).await?;
        for round in 0..40u64 {
            let data = pattern(4 << 20, round + 1);
            client.write(&a, 0, Bytes::from(data.clone())).await?;
            let got = client.read(&b, (4 << 20) - 4096, 4096).await?;
            assert!(got[..] == data[data.len() - 4096..], "round {round}: the read missed the other handle's write");
        }
        client.close(a).await?;
        client.close(b).await?;
        client::Result::Ok(())
    })
    .expect("write through one handle, read through another");
}
