//! Multiple-mount protection (Lustre's MMP): with failover configured, an MDT
//! directory that several MDS processes can reach (a failover pair on shared storage,
//! or processes of one machine) is served by one of them at a time, and a standby
//! takes it over once its MDS stops.
//!
//! The MDS serving the MDT rewrites a small block in its directory (`mmp`) every
//! interval: a sequence number, and who it is. An MDS about to serve the MDT reads the
//! block, waits a little over two intervals and reads it again: a block that changed
//! belongs to a live MDS, and it refuses (a standby keeps waiting); one that stood
//! still is a stopped MDS's. It then writes its own block, waits as long again, and
//! goes ahead only if the block is still its own: two MDSs that take a stopped one's
//! MDT at once see each other, and one backs off. The serving MDS reads the block
//! before each update: one that is not its own means another MDS took the MDT over (it
//! was cut off long enough for its block to look stale), and it stops serving at once.
//!
//! A block that cannot be read whole (being rewritten) counts as changed: the check
//! errs on the side of "in use". Without failover configured there is no block and no
//! wait: one MDS per MDT directory is then the admin's to ensure (and redb's file lock
//! refuses a second process of the same machine).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The block's file in an MDT directory.
pub const MMP_FILE: &str = "mmp";

/// What the block says: the sequence number and who wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    seq: u64,
    owner: String,
}

impl Block {
    fn encode(&self) -> String {
        format!("braid-mmp-v1 {} {}\n", self.seq, self.owner)
    }

    fn decode(text: &str) -> Option<Block> {
        let rest = text.strip_prefix("braid-mmp-v1 ")?.strip_suffix('\n')?;
        let (seq, owner) = rest.split_once(' ')?;
        Some(Block { seq: seq.parse().ok()?, owner: owner.to_string() })
    }
}

/// One MDT taken by this MDS.
pub struct Mmp {
    path: PathBuf,
    owner: String,
    interval: Duration,
    seq: Mutex<u64>,
}

/// How an MDS that finds its MDT served by another behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contended {
    /// Refuses to start.
    Refuse,
    /// Waits until the other stops (`--standby`).
    Wait,
}

enum Read {
    Missing,
    Unreadable,
    Block(Block),
}

fn read(path: &Path) -> Read {
    match std::fs::read_to_string(path) {
        Ok(text) => Block::decode(&text).map_or(Read::Unreadable, Read::Block),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Missing,
        Err(_) => Read::Unreadable,
    }
}

fn write(path: &Path, block: &Block) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    f.write_all(block.encode().as_bytes())?;
    f.sync_data()
}

/// A sequence number no other MDS picks (time and process).
fn fresh_seq() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    (nanos as u64) ^ ((std::process::id() as u64) << 40)
}

impl Mmp {
    /// Takes the MDT in `dir` for `owner` (e.g. the MDS's address), checking every
    /// `interval`. The block's owner when the MDT is in use, with `Refuse`.
    pub async fn take(dir: &Path, owner: &str, interval: Duration, contended: Contended) -> Result<Mmp, String> {
        let path = dir.join(MMP_FILE);
        let settle = interval * 2 + interval / 2;
        let mut said = false;
        loop {
            let before = read(&path);
            if !matches!(before, Read::Missing) {
                tokio::time::sleep(settle).await;
                let after = read(&path);
                let still = matches!((&before, &after), (Read::Block(a), Read::Block(b)) if a == b);
                if !still {
                    let who = match after {
                        Read::Block(b) => b.owner,
                        _ => "an MDS rewriting its block".into(),
                    };
                    match contended {
                        Contended::Refuse => {
                            return Err(format!(
                                "the MDT in {} is served by {who} (its MMP block keeps changing); \
                                 start this MDS with --standby to take it over when that one stops",
                                dir.display()
                            ))
                        }
                        Contended::Wait if !said => {
                            tracing::info!("standing by: the MDT in {} is served by {who}", dir.display());
                            said = true;
                        }
                        Contended::Wait => {}
                    }
                    continue;
                }
            }
            // Free: claim it, and see that nobody else did meanwhile.
            let mine = Block { seq: fresh_seq(), owner: owner.to_string() };
            write(&path, &mine).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            tokio::time::sleep(settle).await;
            match read(&path) {
                Read::Block(b) if b == mine => {
                    return Ok(Mmp { path, owner: owner.to_string(), interval, seq: Mutex::new(mine.seq) });
                }
                _ if contended == Contended::Refuse => {
                    return Err(format!("another MDS took the MDT in {} at the same time", dir.display()));
                }
                _ => tracing::info!("another MDS took the MDT in {} at the same time; standing by", dir.display()),
            }
        }
    }

    /// Keeps the block current every interval. Returns why it stopped: the MDT was
    /// taken over, or the block cannot be written. The MDS must stop serving then.
    pub async fn keep(&self) -> String {
        loop {
            tokio::time::sleep(self.interval).await;
            let seq = *self.seq.lock().expect("mmp seq");
            match read(&self.path) {
                Read::Block(b) if b.seq == seq && b.owner == self.owner => {}
                Read::Block(b) => return format!("{} took the MDT over (its MMP block replaced this MDS's)", b.owner),
                Read::Missing | Read::Unreadable => {
                    return format!("the MMP block {} is gone or damaged", self.path.display())
                }
            }
            let next = Block { seq: seq.wrapping_add(1), owner: self.owner.clone() };
            if let Err(e) = write(&self.path, &next) {
                return format!("cannot write the MMP block {}: {e}", self.path.display());
            }
            *self.seq.lock().expect("mmp seq") = next.seq;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_read_back_and_torn_ones_do_not() {
        let b = Block { seq: 42, owner: "127.0.0.3:9401 pid 7".into() };
        assert_eq!(Block::decode(&b.encode()), Some(b.clone()));
        let text = b.encode();
        for cut in 0..text.len() {
            assert_eq!(Block::decode(&text[..cut]), None, "a block cut at {cut}");
        }
        assert_eq!(Block::decode("braid-mmp-v1 x y\n"), None);
    }

    #[tokio::test]
    async fn a_live_block_keeps_others_out_and_a_stale_one_is_taken() {
        let dir = std::env::temp_dir().join(format!("braid-mmp-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join(MMP_FILE));
        let iv = Duration::from_millis(100);
        let first = Mmp::take(&dir, "first", iv, Contended::Refuse).await.expect("a free MDT");
        let kept = tokio::spawn(async move {
            let why = first.keep().await;
            (first, why)
        });
        let refused = Mmp::take(&dir, "second", iv, Contended::Refuse).await.err().expect("in use");
        assert!(refused.contains("served by first"), "{refused}");
        // The first stops updating (killed): a standby takes over, and the first, were
        // it only cut off, finds out at its next update.
        kept.abort();
        let second = Mmp::take(&dir, "second", iv, Contended::Wait).await.expect("a stale MDT");
        assert_eq!(
            *second.seq.lock().unwrap(),
            match read(&dir.join(MMP_FILE)) {
                Read::Block(b) => b.seq,
                _ => panic!("no block"),
            }
        );
        let stale = Mmp { path: dir.join(MMP_FILE), owner: "first".into(), interval: iv, seq: Mutex::new(1) };
        assert!(stale.keep().await.contains("second took the MDT over"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
