//! Every fuzz target's body over its saved corpus (`corpus/<target>/`), as an ordinary
//! test on stable Rust: a decoder that panics on an input it once survived, or
//! re-encodes differently, fails here.
//!
//! A file's name says what its bytes are: `<what>.<description>`, where `<what>` is
//! what the target must make of them (for `frame_decode` a frame kind, `bare-request`,
//! `bad-message` or `rejected`; for `nbd_decode` the decoders that must accept them,
//! joined by `+`, or `none`). Valid seeds come from braid's own encoders, so a decoder
//! that starts to reject good input (or a wire format changed without a new protocol
//! version) fails too. Files without a `.` (those a fuzzing session adds, named by
//! their hash) must only not panic. `write_seed_corpus` (ignored) writes the seeds
//! again: `cargo test --manifest-path fuzz/Cargo.toml -- --ignored write_seed_corpus`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use braid_fuzz::{encode_info, encode_meta, frame_decode, nbd_decode, Frame, Nbd};
use braid_fuzz::{MODE_BARE_REQUEST, MODE_RAW, MODE_WRAPPED};
use nbd::proto::Request as NbdRequest;
use proto::frame::{encode_frame, FrameKind, HEADER_LEN};
use proto::msg::{Callback, Creds, Hello, Request, Response, TargetKind, Usage};
use proto::{Errno, Fid, ObjectId, RemoteError};
use trace::store::Batch;
use trace::{Op, Record, Target, RECORD_BYTES};

/// The corpus must stay small: it is read on every test run and lives in git.
const CORPUS_BYTES_MAX: u64 = 200 << 10;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
}

/// The files of `target`'s corpus, by name.
fn corpus(target: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = corpus_dir(target);
    let files: BTreeMap<String, Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("a corpus entry").path();
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    assert!(files.len() >= 10, "{}: {} files, not a corpus", dir.display(), files.len());
    let total: u64 = files.values().map(|b| b.len() as u64).sum();
    assert!(total <= CORPUS_BYTES_MAX, "{}: {total} bytes, more than {CORPUS_BYTES_MAX}", dir.display());
    files
}

/// What a `frame_decode` input named `what` is, or `None` for a name that says
/// nothing (a fuzzer's).
fn frame_expected(what: &str) -> Option<Frame> {
    let kind = |k| Some(Frame::Decoded(k));
    match what {
        "request" => kind(FrameKind::Request),
        "response" => kind(FrameKind::Response),
        "handshake" => kind(FrameKind::Handshake),
        "callback" => kind(FrameKind::Callback),
        "callback-ack" => kind(FrameKind::CallbackAck),
        "bare-request" => Some(Frame::BareRequest),
        "bad-request" => Some(Frame::BadMessage(FrameKind::Request)),
        "bad-response" => Some(Frame::BadMessage(FrameKind::Response)),
        "bad-handshake" => Some(Frame::BadMessage(FrameKind::Handshake)),
        "bad-callback" => Some(Frame::BadMessage(FrameKind::Callback)),
        "rejected" => Some(Frame::Rejected),
        _ => None,
    }
}

fn nbd_expected(what: &str) -> Option<Nbd> {
    let mut n = Nbd::default();
    if what == "none" {
        return Some(n);
    }
    for part in what.split('+') {
        match part {
            "request" => n.request = true,
            "info" => n.info = true,
            "meta" => n.meta = true,
            "batch" => n.batch = true,
            _ => return None,
        }
    }
    Some(n)
}

/// Runs `decode` over `target`'s corpus and checks each named file's outcome; returns
/// how many files were named (their outcome checked).
fn run<T: PartialEq + std::fmt::Debug>(
    target: &str,
    decode: impl Fn(&[u8]) -> T,
    expected: impl Fn(&str) -> Option<T>,
) -> usize {
    let mut named = 0;
    let mut wrong = Vec::new();
    for (name, bytes) in corpus(target) {
        let got = decode(&bytes);
        let Some((what, _)) = name.split_once('.') else { continue };
        let want = expected(what).unwrap_or_else(|| panic!("{target}/{name}: a name that says no outcome"));
        named += 1;
        if got != want {
            wrong.push(format!("{name}: {got:?}, not {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{target}: decoded otherwise than the corpus says:\n{}", wrong.join("\n"));
    named
}

#[test]
fn frame_decode_over_its_corpus() {
    let named = run("frame_decode", frame_decode, frame_expected);
    assert!(named >= 30, "{named} seeds");
}

#[test]
fn nbd_decode_over_its_corpus() {
    let named = run("nbd_decode", nbd_decode, nbd_expected);
    assert!(named >= 20, "{named} seeds");
}

/// The seeds for `frame_decode`: inputs of each mode, frames of each kind from
/// braid's encoders, and broken ones.
fn frame_seeds() -> Vec<(String, Vec<u8>)> {
    let fid = Fid { seq: 0x2_0000_0401, oid: 7, ver: 0 };
    let creds = Creds { uid: 1000, gid: 1000, groups: vec![4, 27] };
    let requests = [
        ("ping", Request::Ping),
        ("mgs-get-config", Request::MgsGetConfig),
        (
            "mgs-register",
            Request::MgsRegister {
                kind: TargetKind::Ost,
                uuid: "ost0-uuid".into(),
                index: Some(3),
                address: "10.0.0.7:9002".into(),
                fsname: "braid".into(),
                epoch: 0,
            },
        ),
        (
            "mdt-raft",
            Request::MdtRaft {
                fsname: "braid".into(),
                group: "mdt-replicas-0123456789abcdef".into(),
                kind: proto::msg::RaftRpc::AppendEntries,
            },
        ),
        (
            "mgs-heartbeat",
            Request::MgsHeartbeat {
                kind: TargetKind::Mdt,
                index: 1,
                uuid: "mdt1".into(),
                usage: Usage {
                    total_bytes: 1 << 40,
                    free_bytes: 1 << 39,
                    avail_bytes: 1 << 38,
                    total_inodes: 1 << 20,
                    free_inodes: 1 << 19,
                },
                media: Some(proto::msg::Media { class: "hdd".into(), bw_bytes: Some(150 << 20), lat_us: Some(4000) }),
            },
        ),
        (
            "mgs-pool",
            Request::MgsPool {
                fsname: "braid".into(),
                pool: "flash".into(),
                op: proto::msg::PoolOp::Add,
                osts: vec![0, 2, 3],
            },
        ),
        ("metrics", Request::Metrics),
        ("lookup", Request::MdsLookup { creds: creds.clone(), parent: fid, name: "a file".into() }),
        ("getattr", Request::MdsGetattr { fid }),
        ("unlink", Request::MdsUnlink { creds: creds.clone(), parent: fid, name: "x".into() }),
        ("symlink", Request::MdsSymlink { creds: Creds::root(), parent: fid, name: "l".into(), target: "../t".into() }),
        ("migrate-mdt", Request::MdsMigrate { creds: Creds::root(), parent: fid, name: "proj".into(), mdt: 1 }),
        (
            // A moved file's layout: its objects named by the FID it had (protocol 12).
            "replace-layout",
            Request::MdsReplaceLayout {
                creds: creds.clone(),
                fid,
                layout: {
                    let mut l = layout::LayoutSpec::raid0(Some(1), Some(1 << 20))
                        .instantiate(&[layout::OstState { index: 3, up: true, ..Default::default() }], 0)
                        .unwrap();
                    l.objects = Some(Fid { seq: 0x1, oid: 5, ver: 0 }.into());
                    l
                },
                data_version: 4,
            },
        ),
    ];
    let responses = [
        ("ok", Response::Ok),
        ("error", Response::Error(RemoteError::new(Errno::NoEnt, "no such entry"))),
        ("epoch-moved", Response::EpochMoved { trunc_epoch: 9 }),
        ("registered", Response::Registered { index: 2 }),
        ("moved", Response::Moved { from: fid, to: Fid { seq: 0x1_0000_0001, oid: 9, ver: 0 } }),
    ];
    let hello = Hello { protocol: 1, client_nonce: [0x5a; 32], client_id: 77, role: "client".into() };
    let callbacks = [
        ("revoke-lease", Callback::RevokeLease { dir: fid, lease: 12 }),
        ("object-destroyed", Callback::ObjectDestroyed { ost: 1, object: ObjectId { fid, component: 0, stripe: 2 } }),
    ];
    let raw = |frame: Vec<u8>| [&[MODE_RAW][..], &frame].concat();
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, (name, r)) in requests.iter().enumerate() {
        out.push((format!("request.{name}"), raw(encode_frame(FrameKind::Request, i as u64 + 1, &msg(r), &[]))));
        out.push((format!("bare-request.{name}"), [&[MODE_BARE_REQUEST][..], &msg(r)].concat()));
    }
    // A request followed by the job id it is made for (protocol 10).
    let with_job = proto::msg::encode_request(&requests[0].1, Some("slurm-4711")).unwrap();
    out.push(("request.ping-with-job".into(), raw(encode_frame(FrameKind::Request, 8, &with_job, &[]))));
    out.push(("bare-request.ping-with-job".into(), [&[MODE_BARE_REQUEST][..], &with_job].concat()));
    let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    out.push((
        "request.ping-with-payload".into(),
        raw(encode_frame(FrameKind::Request, 9, &msg(&Request::Ping), &page)),
    ));
    for (i, (name, r)) in responses.iter().enumerate() {
        out.push((format!("response.{name}"), raw(encode_frame(FrameKind::Response, i as u64, &msg(r), &[]))));
    }
    out.push((
        "response.ok-with-payload".into(),
        raw(encode_frame(FrameKind::Response, 5, &msg(&Response::Ok), &page[..1000])),
    ));
    out.push(("handshake.hello".into(), raw(encode_frame(FrameKind::Handshake, 0, &msg(&hello), &[]))));
    for (name, c) in &callbacks {
        out.push((format!("callback.{name}"), raw(encode_frame(FrameKind::Callback, 3, &msg(c), &[]))));
    }
    out.push(("callback-ack.empty".into(), raw(encode_frame(FrameKind::CallbackAck, 3, &[], &[]))));
    // Mode 1 wraps the rest in a frame, cut at its first byte: messages whose first
    // byte is their length are whole messages, the rest their payload.
    let wrapped = |mode: u8, m: Vec<u8>, payload: &[u8]| {
        assert_eq!(m[0] as usize, m.len(), "{m:?}: a message whose first byte is its length");
        assert_eq!(mode % 3, MODE_WRAPPED);
        [&[mode][..], &m, payload].concat()
    };
    let getattr = msg(&Request::MdsGetattr { fid: Fid { seq: 200, oid: 1, ver: 0 } });
    out.push(("request.wrapped-getattr".into(), wrapped(1, getattr, &page[..100])));
    let registered = msg(&Response::Registered { index: 300 });
    out.push(("response.wrapped-registered".into(), wrapped(0x82, registered, &[])));
    out.push(("bad-request.wrapped-short-register".into(), [1, 1].to_vec()));
    out.push(("bad-response.wrapped-short-error".into(), [0x82, 1, 9, 9].to_vec()));
    // Broken frames.
    let good = encode_frame(FrameKind::Request, 1, &msg(&requests[4].1), &page[..64]);
    out.push(("rejected.empty".into(), vec![]));
    out.push(("rejected.mode-only".into(), vec![MODE_RAW]));
    out.push(("rejected.header-cut".into(), raw(good[..HEADER_LEN - 1].to_vec())));
    out.push(("rejected.last-byte-cut".into(), raw(good[..good.len() - 1].to_vec())));
    let mut broken = |what: &str, at: usize, byte: u8| {
        let mut f = good.clone();
        f[at] = byte;
        out.push((format!("rejected.{what}"), raw(f)));
    };
    broken("bad-magic", 0, b'X');
    broken("bad-version", 4, 9);
    broken("bad-kind", 5, 5);
    broken("msg-too-large", 19, 0x40);
    broken("payload-too-large", 23, 0x40);
    broken("checksum", HEADER_LEN + 2, good[HEADER_LEN + 2] ^ 1);
    broken("payload-flipped", good.len() - 1, good[good.len() - 1] ^ 0x80);
    out.push(("rejected.bare-request-cut".into(), [&[MODE_BARE_REQUEST][..], &[1, 1]].concat()));
    out.push(("rejected.bare-request-bad-variant".into(), vec![MODE_BARE_REQUEST, 0xff, 0x7f]));
    out.push((
        "bad-request.garbage-message".into(),
        raw(encode_frame(FrameKind::Request, 4, &[0xff, 0xff, 0xff], &[])),
    ));
    out.push(("bad-handshake.short-hello".into(), raw(encode_frame(FrameKind::Handshake, 0, &[1, 2], &[]))));
    out.push(("bad-callback.unknown".into(), raw(encode_frame(FrameKind::Callback, 0, &[9], &[]))));
    out
}

/// The seeds for `nbd_decode`: transmission requests of each command, option data
/// of `NBD_OPT_GO` and the meta-context options, trace batches, and broken ones.
fn nbd_seeds() -> Vec<(String, Vec<u8>)> {
    use nbd::proto::*;
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let req = |flags, kind, length| NbdRequest { flags, kind, cookie: 0x1122_3344_5566_7788, offset: 1 << 20, length };
    for (name, r) in [
        ("read", req(0, CMD_READ, 4096)),
        ("write-fua", req(CMD_FLAG_FUA, CMD_WRITE, 512)),
        ("disc", req(0, CMD_DISC, 0)),
        ("flush", req(0, CMD_FLUSH, 0)),
        ("trim", req(0, CMD_TRIM, 1 << 20)),
        ("cache", req(0, CMD_CACHE, 65536)),
        ("write-zeroes-no-hole", req(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, u32::MAX)),
        ("block-status-req-one", req(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 1 << 30)),
        ("unknown-command", req(0xffff, 99, 1)),
    ] {
        out.push((format!("request.{name}"), r.encode().to_vec()));
    }
    let data: Vec<u8> = (0..512u32).map(|i| (i * 13 % 256) as u8).collect();
    out.push(("request.write-with-data".into(), [&req(0, CMD_WRITE, 512).encode()[..], &data].concat()));
    let info =
        |name: &str, requests: &[u16]| encode_info(&InfoRequest { name: name.into(), requests: requests.to_vec() });
    out.push(("info.go-default-export".into(), info("", &[])));
    out.push(("info.go-named".into(), info("disk0", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION])));
    out.push(("info.info-every-request".into(), info("vm/images/a.raw", &[0, 1, 2, 3, 4, 5])));
    let meta = |name: &str, q: &[&str]| {
        encode_meta(&MetaRequest { name: name.into(), queries: q.iter().map(|s| s.to_string()).collect() })
    };
    out.push(("meta.list-all".into(), meta("disk0", &[])));
    out.push(("meta.set-base-allocation".into(), meta("disk0", &["base:allocation"])));
    out.push(("meta.list-two".into(), meta("", &["base:", "qemu:dirty-bitmap:b0"])));
    let record = |i: u32| Record {
        start_ns: 1_700_000_000_000_000_000 + u64::from(i) * 1000,
        dur_ns: 25_000 + i,
        pid: 4242,
        uid: 1000,
        gid: 1000,
        fid: Fid { seq: 0x2_0000_0401, oid: i, ver: 0 },
        offset: u64::from(i) << 20,
        len: 1 << 20,
        job: i % 2,
        op: Op::ALL[i as usize % Op::ALL.len()],
        errno: 0,
        target: if i.is_multiple_of(2) { Target::Ost(i as u16) } else { Target::Mdt(0) },
    };
    let records = |n: u32| {
        let mut out = Vec::new();
        for i in 0..n {
            let mut b = [0u8; RECORD_BYTES];
            record(i).encode(&mut b);
            out.extend_from_slice(&b);
        }
        out
    };
    let batch = |client: &str, jobs: Vec<(u32, String)>, lost, n| Batch {
        client: client.into(),
        jobs,
        lost,
        records: records(n),
    };
    let jobs = vec![(0, "train.sh".to_string()), (1, "slurm-1234".to_string())];
    out.push(("batch.empty".into(), batch("", vec![], 0, 0).encode()));
    out.push(("batch.one-record".into(), batch("node07", vec![], 0, 1).encode()));
    out.push(("batch.jobs-and-records".into(), batch("node07", jobs.clone(), 3, 8).encode()));
    // Broken ones.
    let good_req = req(0, CMD_READ, 4096).encode();
    out.push(("none.empty".into(), vec![]));
    out.push(("none.request-cut".into(), good_req[..REQUEST_BYTES - 1].to_vec()));
    let mut bad_magic = good_req;
    bad_magic[3] ^= 1;
    out.push(("none.request-bad-magic".into(), bad_magic.to_vec()));
    let go = info("disk0", &[INFO_NAME]);
    out.push(("none.info-cut".into(), go[..go.len() - 1].to_vec()));
    out.push(("none.info-trailing-byte".into(), [&go[..], &[0]].concat()));
    out.push(("none.info-name-not-utf8".into(), [&[0, 0, 0, 2, 0xc3, 0x28][..], &[0, 0]].concat()));
    out.push(("none.info-name-too-long".into(), [&[0xff, 0xff, 0xff, 0xff][..], b"disk"].concat()));
    let set = meta("disk0", &["base:allocation"]);
    out.push(("none.meta-cut".into(), set[..set.len() - 3].to_vec()));
    let mut many = meta("d", &[]);
    let n = many.len();
    many[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
    out.push(("none.meta-count-too-large".into(), many));
    let b = batch("node07", jobs, 0, 2).encode();
    out.push(("none.batch-cut".into(), b[..b.len() - 1].to_vec()));
    out.push(("none.batch-trailing-byte".into(), [&b[..], &[0]].concat()));
    let mut v = b.clone();
    v[0] = 2;
    out.push(("none.batch-version".into(), v));
    let mut op = b.clone();
    let at = b.len() - RECORD_BYTES + 60;
    op[at] = 0xff;
    out.push(("none.batch-record-bad-op".into(), op));
    let mut count = batch("c", vec![], 0, 0).encode();
    let n = count.len();
    count[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    out.push(("none.batch-count-too-large".into(), count));
    out
}

/// A message as postcard bytes, as braid's RPC layer sends it.
fn msg<T: serde::Serialize>(m: &T) -> Vec<u8> {
    postcard::to_stdvec(m).expect("encode a message")
}

/// The named seeds: also checked without the files, so a seed that is not what its
/// name says is found before it is written.
#[test]
fn seeds_are_what_their_names_say() {
    for (name, bytes) in frame_seeds() {
        let what = name.split_once('.').expect("a named seed").0;
        assert_eq!(Some(frame_decode(&bytes)), frame_expected(what), "frame_decode seed {name}");
    }
    for (name, bytes) in nbd_seeds() {
        let what = name.split_once('.').expect("a named seed").0;
        assert_eq!(Some(nbd_decode(&bytes)), nbd_expected(what), "nbd_decode seed {name}");
    }
}

/// Writes the seeds into the corpus (files a fuzzing session added stay).
#[test]
#[ignore = "writes the seed corpus: run by hand after a change of the wire formats"]
fn write_seed_corpus() {
    for (target, seeds) in [("frame_decode", frame_seeds()), ("nbd_decode", nbd_seeds())] {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("create the corpus directory");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(&name), bytes).expect("write a seed");
        }
    }
}
