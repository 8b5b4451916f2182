//! A small file's bytes read at its open, beside the open itself.
//!
//! A reader of many small files (`tar cf`, `cp -a`, `grep -r`, a loader of training
//! samples) waits per file for the open at the MDS and then for the read at an OST:
//! two round trips, one after the other. When this client was told the file's layout
//! and size moments ago (the lookup the kernel makes before the open, a listing's
//! attributes) and the file is small, an open for reading sends the OST read of the
//! file's first bytes at the same moment as the MDS open, so the two round trips
//! overlap. The bytes serve the handle's reads (as a small Data-on-MDT file's bytes,
//! which come with the open itself, do) only if the open's answer names the same
//! layout and a size they cover, and no write of this client to the file was on its
//! way meanwhile; otherwise they are dropped, and the reads go to the OSTs as before.
//!
//! What the bytes are: the OSTs' content as the open found it, sent once the open
//! had started, so every write a close-to-open reader must see (closed before the
//! open) is in them; a write of another client racing the open may or may not be,
//! as with a read issued at that moment.
//!
//! What it costs: one OST read per such open that a kernel holding the file's pages
//! would not have made (the mount asks only when the kernel has forgotten the
//! inode), and memory for at most [`HINTS_MAX`] hints of [`HINT_TTL`] each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use layout::Layout;
use proto::msg::{Attr, Creds, FileKind, OpenFlags};
use proto::Fid;

use crate::{io, Client, OpenFile, Result};

/// Largest file whose bytes are read with its open: FUSE's largest read, so the
/// kernel's first read of such a file asks for all of it.
pub const FIRST_BYTES_MAX: u64 = 128 << 10;
/// Reads at open are rounded up to this (a file a little larger than the hint said
/// is still covered).
const FIRST_BYTES_STEP: u64 = 64 << 10;
/// How long a file's layout and size, as last told, stay a hint for its open.
pub const HINT_TTL: Duration = Duration::from_secs(5);
/// Most hints kept; all are dropped when full (a hint only saves time).
pub const HINTS_MAX: usize = 16 * 1024;

/// What an open of a file may read beside itself: the layout the read is cut by and
/// how many bytes to read.
pub(crate) struct Hint {
    pub layout: Layout,
    pub len: u64,
    /// The file's data version as told.
    pub version: u64,
}

/// The layouts and sizes of small files with objects on OSTs, as this client was
/// last told them.
#[derive(Default)]
pub(crate) struct Hints {
    files: Mutex<HashMap<Fid, (Layout, u64, u64, Instant)>>,
    /// Opens whose bytes read beside them were kept for the handle.
    pub kept: AtomicU64,
}

impl Hints {
    /// Notes what `attr` tells of its file, if it is a small file with OST objects.
    pub fn note(&self, attr: &Attr) {
        let Some(layout) = attr.layout.as_ref() else { return };
        if attr.kind != FileKind::File {
            return;
        }
        let mut files = self.files.lock().expect("first-bytes hints");
        // A Data-on-MDT file's bytes come with its open; an empty one has none to
        // read; a large one is read ahead in its own way.
        if attr.size == 0 || attr.size > FIRST_BYTES_MAX || layout.dom_end().is_some() {
            files.remove(&attr.fid);
            return;
        }
        if files.len() >= HINTS_MAX {
            files.clear();
        }
        files.insert(attr.fid, (layout.clone(), attr.size, attr.data_version, Instant::now()));
    }

    /// The hint for an open of `fid` now, taken (an open uses it once).
    pub fn take(&self, fid: Fid) -> Option<Hint> {
        let (layout, size, version, at) = self.files.lock().expect("first-bytes hints").remove(&fid)?;
        let len = size.next_multiple_of(FIRST_BYTES_STEP).min(FIRST_BYTES_MAX);
        (at.elapsed() < HINT_TTL && layout.instantiated_below(len)).then_some(Hint { layout, len, version })
    }
}

impl Client {
    /// Opens an existing file as [`Client::open`] does, for a caller about to read it
    /// that holds none of its bytes, or holds them as of data version `held` (the
    /// mount: the kernel's pages, kept only if the open finds the file at that
    /// version): a small file's first bytes are read beside the open when this client
    /// was just told its layout, at a version other than `held` (see
    /// [`first_bytes`](self)), and become the handle's first chunk read ahead if the
    /// open's answer bears them out.
    pub async fn open_to_read(
        &self,
        creds: &Creds,
        fid: Fid,
        flags: OpenFlags,
        held: Option<u64>,
    ) -> Result<(OpenFile, Attr)> {
        let reading = flags.read && !flags.write && !flags.truncate;
        // The caches have their own read path; a write of this client to the file,
        // on its way or held back, would be missed by an OST read sent now.
        let hint = (reading && self.inner.cache.is_none() && self.inner.pages.is_none())
            .then(|| self.inner.first_bytes.take(fid))
            .flatten()
            .filter(|h| held != Some(h.version))
            .filter(|_| !self.inner.deferred.busy(fid) && self.file_inflights(fid).is_empty());
        let Some(Hint { layout, len, .. }) = hint else { return self.open(creds, fid, flags).await };
        // Taken before the read is sent: a write of this client from here on drops it.
        let sent = self.open_sent();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (c, cut_by) = (self.clone(), layout.clone());
        tokio::spawn(rpc::stats::in_current_job(async move {
            let _ = tx.send(io::read_extents(&c, fid, &cut_by, 0, len).await.map(|(data, _)| data));
        }));
        let (f, attr) = self.open(creds, fid, flags).await?;
        // The bytes hold for this open if they were cut by its layout, cover its size,
        // and no write of this client to the file was on its way meanwhile.
        if *f.layout() == layout && attr.size <= len && !self.written_since(fid, sent) {
            let gen = f.inflight.data_gen.load(Ordering::Acquire);
            if let Ok(mut ra) = f.readahead.try_lock() {
                ra.seed(len, rx, gen);
                self.inner.first_bytes.kept.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok((f, attr))
    }

    /// Opens whose small file's bytes, read beside the open, became the handle's
    /// (see [`first_bytes`](self)).
    pub fn first_bytes_kept(&self) -> u64 {
        self.inner.first_bytes.kept.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::{Component, Pattern, EOF};
    use proto::msg::{Creds, Timespec};

    fn file(size: u64, pattern: Pattern, osts: Vec<u32>) -> Attr {
        let fid = Fid::new(0, 1, 7);
        let mut attr = Attr::new_inode(fid, FileKind::File, 0o644, &Creds::root(), 0, Timespec::now());
        attr.size = size;
        let extent_end = if pattern == Pattern::Mdt { 1 << 20 } else { EOF };
        let c = Component {
            id: 1,
            extent_start: 0,
            extent_end,
            pattern,
            stripe_size: 1 << 20,
            stripe_count_wanted: osts.len() as i64,
            osts,
            pool: None,
            mirror: 0,
            flags: 0,
        };
        attr.layout = Some(Layout { generation: 1, components: vec![c], objects: None });
        attr
    }

    #[test]
    fn a_small_file_on_osts_is_read_with_its_open_once_with_its_size_rounded_up() {
        let hints = Hints::default();
        let attr = file(5000, Pattern::Raid0, vec![2]);
        hints.note(&attr);
        let hint = hints.take(attr.fid).expect("a hint for a small file on an OST");
        assert_eq!(hint.len, FIRST_BYTES_STEP);
        assert_eq!(Some(&hint.layout), attr.layout.as_ref());
        assert!(hints.take(attr.fid).is_none(), "a hint serves one open");
        hints.note(&file(FIRST_BYTES_MAX, Pattern::Raid0, vec![2]));
        assert_eq!(hints.take(attr.fid).map(|h| h.len), Some(FIRST_BYTES_MAX));
    }

    #[test]
    fn large_empty_data_on_mdt_and_uninstantiated_files_get_no_hint() {
        let hints = Hints::default();
        let fid = Fid::new(0, 1, 7);
        for attr in [
            file(FIRST_BYTES_MAX + 1, Pattern::Raid0, vec![2]),
            file(0, Pattern::Raid0, vec![2]),
            file(100, Pattern::Mdt, vec![]),
            file(100, Pattern::Raid0, vec![]),
        ] {
            hints.note(&file(100, Pattern::Raid0, vec![2]));
            hints.note(&attr);
            assert!(hints.take(fid).is_none(), "{:?} of {} bytes", attr.layout, attr.size);
        }
    }
}
