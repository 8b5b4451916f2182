//! An OST's half of `braid fsck`: its objects listed in a stable order (fan-out
//! directory, then name), page by page, for the checker to compare with the
//! layouts the MDTs hold; and an object no layout names moved into the OST's
//! `lost+found/` (out of the object namespace, still readable by an admin), as
//! LFSCK moves orphan objects aside.

use std::io::ErrorKind;

use proto::msg::{FsckObjects, Response};
use proto::{Errno, ObjectId};

use crate::Ost;

/// The most objects one page lists.
pub const LIST_MAX: u32 = 4096;

/// The directory of an OST orphan objects are moved into.
pub const LOST_FOUND: &str = "lost+found";

/// Objects of `ost` after `after`, at most `max`. A name in the object directories
/// that is not an object's is skipped (and logged): it is no object of a file.
pub fn list(ost: &Ost, after: Option<ObjectId>, max: u32) -> (Response, Vec<bytes::Bytes>) {
    let max = max.clamp(1, LIST_MAX) as usize;
    let start = after.map(|o| (o.bucket(), o.file_name()));
    let mut out = FsckObjects::default();
    let first_bucket = start.as_ref().map_or(0, |(b, _)| u8::from_str_radix(b, 16).unwrap_or(0) as u32);
    for b in first_bucket..256 {
        let bucket = format!("{b:02x}");
        let dir = ost.dir.join("objects").join(&bucket);
        let mut names: Vec<String> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect(),
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => {
                return (
                    Response::error(Errno::Io, format!("OST{:04x}: cannot list {}: {e}", ost.index, dir.display())),
                    vec![],
                )
            }
        };
        names.sort();
        for name in names {
            if start.as_ref().is_some_and(|(sb, sn)| *sb == bucket && name <= *sn) {
                continue;
            }
            let Some(o) = ObjectId::from_file_name(&name).filter(|o| o.bucket() == bucket) else {
                tracing::debug!(ost = ost.index, bucket, name, "fsck: not an object's name; skipped");
                continue;
            };
            let size = match std::fs::metadata(dir.join(&name)) {
                Ok(m) => m.len(),
                // Destroyed meanwhile.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return (Response::error(Errno::Io, format!("stat {name}: {e}")), vec![]),
            };
            out.objects.push((o, size));
            if out.objects.len() >= max {
                return answer(out);
            }
        }
    }
    out.done = true;
    answer(out)
}

fn answer(page: FsckObjects) -> (Response, Vec<bytes::Bytes>) {
    match proto::msg::encode(&page) {
        Ok(b) => (Response::Data, vec![bytes::Bytes::from(b)]),
        Err(e) => (Response::error(Errno::Io, format!("cannot encode the object list: {e}")), vec![]),
    }
}

/// Moves `o` into the OST's `lost+found/`. Absent, it is already gone: fine.
pub fn to_lost_found(ost: &Ost, o: &ObjectId) -> Response {
    let dir = ost.dir.join(LOST_FOUND);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Response::error(Errno::Io, format!("cannot make {}: {e}", dir.display()));
    }
    match std::fs::rename(ost.object_path(o), dir.join(o.file_name())) {
        Ok(()) => {
            tracing::info!(ost = ost.index, object = %o.file_name(), "fsck: orphan object moved to lost+found");
            Response::Ok
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Response::Ok,
        Err(e) => Response::error(Errno::Io, format!("cannot move {} to {}: {e}", o.file_name(), dir.display())),
    }
}
