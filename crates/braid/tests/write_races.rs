//! Write-behind racing a size report or read-ahead of the same handle: the size a
//! flush publishes and the bytes a read returns cover every write that returned.

use std::path::Path;

use bytes::Bytes;
use proto::msg::OpenFlags;
use proto::Fid;
use testkit::{Cluster, ClusterSpec};

#[test]
fn a_flush_racing_a_write_leaves_its_size_to_the_next_flush() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "1", &c.url("/f")]);
    // One thread: join! polls the write first, then the flush while the write waits.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let mb = 1u64 << 20;
    let size = rt
        .block_on(async {
            let rw = OpenFlags { read: true, write: true, truncate: false };
            let (f, _) = client.open_at(&creds, Fid::ROOT, "f", rw).await?;
            client.write(&f, 0, Bytes::from(vec![1u8; mb as usize])).await?;
            // The second write overlaps the first, still on its way (write-behind): it
            // waits for it after counting itself in the handle's data generation and
            // before growing the size, and the flush (as a close of another descriptor
            // of the handle, e.g. a forked child's exec) runs in that gap.
            let second = client.write(&f, mb / 2, Bytes::from(vec![2u8; mb as usize]));
            let (w, fl) = tokio::join!(second, client.flush(&f));
            w?;
            fl?;
            // close(2): the flush that must publish the size, then the release.
            client.flush(&f).await?;
            let fid = f.fid;
            client.close(f).await?;
            client::Result::Ok(client.getattr(fid).await?.size)
        })
        .expect("write, flush, close");
    assert_eq!(size, 3 * mb / 2, "the MDS's size after close(2) covers every write");
}

#[test]
fn read_ahead_issued_while_a_write_waits_is_not_served_after_it() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "1", &c.url("/f")]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let mb = 1u64 << 20;
    let back = rt
        .block_on(async {
            let rw = OpenFlags { read: true, write: true, truncate: false };
            let (f, _) = client.open_at(&creds, Fid::ROOT, "f", rw).await?;
            // A large write on its way (write-behind) ...
            client.write(&f, 4 * mb, Bytes::from(vec![b'A'; 32 * mb as usize])).await?;
            // ... which a second write over its start waits for, having already dropped
            // the read-ahead; meanwhile two consecutive reads just below make the
            // handle read ahead over both writes' range.
            let second = client.write(&f, 4 * mb, Bytes::from(vec![b'B'; mb as usize]));
            let reads = async {
                client.read(&f, 4 * mb - 128 * 1024, 64 * 1024).await?;
                client.read(&f, 4 * mb - 64 * 1024, 64 * 1024).await
            };
            let (w, r) = tokio::join!(second, reads);
            w?;
            r?;
            client.read(&f, 4 * mb, mb).await
        })
        .expect("write and read");
    let bad = back.iter().filter(|&&b| b != b'B').count();
    assert_eq!(
        bad,
        0,
        "bytes of the second write read back as something else (first: {:?})",
        back.iter().find(|&&b| b != b'B')
    );
}
