//! File layouts and the pure math that maps file byte ranges to objects.
//!
//! A braid file's layout is *composite* from day one (as Lustre's PFL): a list of
//! [`Component`]s, each covering an extent of the file `[extent_start, extent_end)` and
//! each striped RAID-0 over its own OSTs. A plain "striped file" is simply a layout with
//! one component covering `[0, EOF)`. Later capabilities (PFL instantiation, Data-on-MDT,
//! mirrors) extend this type instead of replacing it.
//!
//! Two kinds of value live here:
//! - [`LayoutSpec`]: what a user or a directory default *asks for* (`setstripe -c -S -i -o`),
//!   fields may be unset and are filled from a fallback;
//! - [`Layout`]: what a file *has*: components with concrete OST indices.
//!
//! Mapping uses the absolute file offset, like Lustre: within a component of stripe size
//! `S` and stripe count `C`, file offset `x` lives in stripe `(x / S) % C` at object offset
//! `(x / (S*C)) * S + x % S`. Objects therefore never need to know where their component
//! starts, and a component's objects are sparse below its extent.

mod dirhash;
mod parse;
mod spec;

pub use dirhash::{fnv_1a_64, DirHash, DIR_STRIPES_MAX};
pub use parse::{format_size, parse_ost_list, parse_size};
pub use spec::{
    choose_osts, ComponentSpec, LayoutChange, LayoutSpec, OstState, PlacementError, QOS_THRESHOLD_PERCENT, TEMPLATES,
};

use serde::{Deserialize, Serialize};

/// Stripe sizes are multiples of this (Lustre's rule).
pub const STRIPE_SIZE_UNIT: u64 = 64 * 1024;
/// Largest stripe size accepted (Lustre caps it at 4 GiB).
pub const STRIPE_SIZE_MAX: u64 = 4 << 30;
/// Largest stripe count of one component (Lustre's LOV_MAX_STRIPE_COUNT).
pub const STRIPE_COUNT_MAX: u32 = 2000;
/// Extent end meaning "to the end of the file, however large".
pub const EOF: u64 = u64::MAX;
/// Most components in one layout (Lustre's limit for a composite layout).
pub const COMPONENTS_MAX: usize = 64;

/// Errors of layout validation and mapping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("stripe size {0} is not a multiple of 64 KiB")]
    StripeSizeUnaligned(u64),
    #[error("stripe size {0} is out of range (64 KiB to 4 GiB)")]
    StripeSizeRange(u64),
    #[error("stripe count {0} is invalid (use -1 for all OSTs, or 1..={STRIPE_COUNT_MAX})")]
    StripeCount(i64),
    #[error("stripe count {count} is larger than the explicit OST list of {list} OSTs")]
    CountExceedsList { count: i64, list: usize },
    #[error("OST index {0} appears twice in the OST list")]
    DuplicateOst(u32),
    /// Extents out of order or with a gap.
    #[error("{0}")]
    Extents(String),
    #[error("extent end {0} is not a multiple of 64 KiB")]
    ExtentUnaligned(u64),
    /// An error of one component of a composite layout (1 for the first). The inner
    /// error is part of the text, not a separate `source`.
    #[error("component {index}: {error}")]
    Component { index: usize, error: Box<LayoutError> },
    #[error("byte {0} is past the end of the file's last component (add one with --component-add)")]
    BeyondLayout(u64),
    #[error("{0}")]
    Change(String),
    /// A Data-on-MDT component against the rules (first only, an end, no stripes).
    #[error("{0}")]
    Dom(String),
    #[error("unknown layout template '{0}' (known: {TEMPLATES})")]
    UnknownTemplate(String),
    #[error("a layout needs at least one component")]
    Empty,
    #[error("too many components ({0}, at most 64)")]
    TooManyComponents(usize),
    #[error("component {0} covering the requested range is not instantiated")]
    NotInstantiated(u32),
    #[error("byte range {offset}+{len} overflows the 64-bit file size")]
    Overflow { offset: u64, len: u64 },
    #[error("invalid size '{0}' (examples: 65536, 64K, 1M, 4G)")]
    BadSize(String),
    #[error("invalid OST list '{0}' (examples: 0,2,5 or 1-3)")]
    BadOstList(String),
    /// A mirrored layout against the rules, or a mirror that cannot do what was asked.
    #[error("{0}")]
    Mirror(String),
}

/// How a component stores its bytes. New patterns go at the end: the order is part
/// of the stored and wire encodings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pattern {
    /// Round-robin striping over OST objects.
    #[default]
    Raid0,
    /// Data-on-MDT: the component's bytes are kept by the MDT of the file, in its
    /// database (`-L mdt`). Only a first component may be one; its stripe size is its
    /// extent and it has no OSTs.
    Mdt,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Raid0 => "raid0",
            Pattern::Mdt => "mdt",
        }
    }
}

/// Largest Data-on-MDT component a layout may ask for (Lustre's client refuses more
/// than 1 GiB); each MDS also has its own, smaller cap.
pub const DOM_SIZE_MAX: u64 = 1 << 30;

/// One extent of a file and how it is striped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// Stable id within the file; part of every object's name on the OSTs.
    pub id: u32,
    pub extent_start: u64,
    /// Exclusive end; [`EOF`] for the last component.
    pub extent_end: u64,
    pub pattern: Pattern,
    pub stripe_size: u64,
    /// OST index of each stripe, in stripe order. Its length is the stripe count.
    /// Empty while the component is not instantiated (PFL components past the data).
    pub osts: Vec<u32>,
    /// Stripe count asked for, used when a non-instantiated component is instantiated.
    pub stripe_count_wanted: i64,
    pub pool: Option<String>,
    /// The mirror the component belongs to (Lustre's `lcme_mirror_id`); 0 in a
    /// layout without mirrors.
    pub mirror: u16,
    /// [`Component::STALE`] and [`Component::PREFER`] (Lustre's `lcme_flags`, less
    /// `init`, which is whether the component has objects).
    pub flags: u16,
}

impl Component {
    /// The component's bytes are older than another mirror's: not read, and brought
    /// back by `braid mirror resync`.
    pub const STALE: u16 = 1;
    /// Reads go to this mirror first.
    pub const PREFER: u16 = 2;

    pub fn is_stale(&self) -> bool {
        self.flags & Component::STALE != 0
    }

    pub fn is_prefer(&self) -> bool {
        self.flags & Component::PREFER != 0
    }

    /// Whether the component covers some byte of `[start, end)`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.extent_start < end && start < self.extent_end
    }

    /// Lustre's `lcme_flags` as `lfs getstripe` prints them (`init,stale,prefer`).
    pub fn flag_names(&self) -> String {
        let mut names = Vec::new();
        if self.is_instantiated() {
            names.push("init");
        }
        if self.is_stale() {
            names.push("stale");
        }
        if self.is_prefer() {
            names.push("prefer");
        }
        match names.is_empty() {
            true => "0".to_string(),
            false => names.join(","),
        }
    }

    /// Whether the component has somewhere to keep its bytes: OST objects, or the
    /// MDT for Data-on-MDT (always).
    pub fn is_instantiated(&self) -> bool {
        self.is_dom() || !self.osts.is_empty()
    }

    /// Whether the component's bytes live on the MDT (Data-on-MDT).
    pub fn is_dom(&self) -> bool {
        self.pattern == Pattern::Mdt
    }

    pub fn stripe_count(&self) -> u32 {
        self.osts.len() as u32
    }

    /// Stripe index and object offset of file offset `x` (which must lie in this
    /// component's extent and the component must be instantiated). A DoM component
    /// is one object at the file's own offsets.
    pub fn map(&self, x: u64) -> (u32, u64) {
        debug_assert!(self.is_instantiated());
        if self.is_dom() {
            return (0, x);
        }
        let s = self.stripe_size;
        let c = self.osts.len() as u64;
        let unit = x / s;
        let stripe = (unit % c) as u32;
        let object_offset = (unit / c) * s + x % s;
        (stripe, object_offset)
    }

    /// Inverse of [`Component::map`]: the file offset stored at `object_offset` of `stripe`.
    pub fn file_offset(&self, stripe: u32, object_offset: u64) -> u64 {
        if self.is_dom() {
            return object_offset;
        }
        let s = self.stripe_size;
        let c = self.osts.len() as u64;
        let row = object_offset / s;
        (row * c + stripe as u64) * s + object_offset % s
    }

    /// Size the object of `stripe` must have (at most) when the file is `file_size` bytes
    /// long: used to punch objects on truncate.
    pub fn object_size_for_file_size(&self, stripe: u32, file_size: u64) -> u64 {
        let limit = file_size.min(self.extent_end);
        if limit <= self.extent_start || !self.is_instantiated() {
            return 0;
        }
        if self.is_dom() {
            return limit;
        }
        let s = self.stripe_size;
        let c = self.osts.len() as u64;
        let row_bytes = s * c;
        let full_rows = limit / row_bytes;
        let rem = limit % row_bytes;
        let lo = stripe as u64 * s;
        let partial = rem.saturating_sub(lo).min(s);
        full_rows * s + partial
    }

    /// File size implied by an object of `stripe` being `object_size` bytes long (the
    /// offset just past its last byte); used to glimpse sizes from the OSTs.
    pub fn file_size_from_object(&self, stripe: u32, object_size: u64) -> u64 {
        if object_size == 0 || !self.is_instantiated() {
            return 0;
        }
        (self.file_offset(stripe, object_size - 1) + 1).min(self.extent_end)
    }
}

/// The layout of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Bumped on every change of the layout (Lustre's `lmm_layout_gen`).
    pub generation: u32,
    pub components: Vec<Component>,
    /// The FID the file's OST objects are named by when it is not the file's own
    /// (Lustre's `lmm_oi`): a file moved to another MDT under a new FID (`braid
    /// migrate -m`) keeps its objects where they are. `None` for every other file.
    pub objects: Option<ObjectsFid>,
}

/// A FID as a layout records it: the `proto` crate's `Fid`, which builds on this
/// crate and converts from and to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectsFid {
    pub seq: u64,
    pub oid: u32,
    pub ver: u32,
}

/// One contiguous piece of a byte range as it lies in one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Index into [`Layout::components`].
    pub component: usize,
    pub stripe: u32,
    /// The OST of the object; `None` for a DoM component (the file's MDT).
    pub ost: Option<u32>,
    pub object_offset: u64,
    pub file_offset: u64,
    pub len: u64,
}

/// A run of bytes contiguous in one object, possibly gathered from several places of
/// the caller's buffer (consecutive stripe units of one object are `S*C` apart in the
/// file but adjacent in the object). One such run becomes one OST RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectExtent {
    pub component: usize,
    pub component_id: u32,
    pub stripe: u32,
    /// The OST of the object; `None` for a DoM component (the file's MDT).
    pub ost: Option<u32>,
    pub object_offset: u64,
    pub len: u64,
    /// `(offset in the caller's buffer, length)` pieces, in object order.
    pub pieces: Vec<(u64, u64)>,
}

impl Layout {
    /// Checks the invariants every stored layout must keep: components follow each
    /// other from 0 (the last may end before EOF: a write past it fails until a
    /// component is added), extents 64 KiB aligned, ids unique. A mirrored layout
    /// (FLR) is its mirrors one after the other, by mirror id, each such a run of
    /// components from 0 to EOF, none of them Data-on-MDT.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.components.is_empty() {
            return Err(LayoutError::Empty);
        }
        if self.components.len() > COMPONENTS_MAX {
            return Err(LayoutError::TooManyComponents(self.components.len()));
        }
        let mirrored = self.is_mirrored();
        let mut start = 0;
        let mut ids = std::collections::HashSet::new();
        let mut mirror = self.components[0].mirror;
        for c in &self.components {
            if mirrored && (c.mirror == 0 || c.is_dom()) {
                return Err(LayoutError::Mirror(format!(
                    "component {} of a mirrored layout has no mirror id or is Data-on-MDT",
                    c.id
                )));
            }
            if c.mirror != mirror {
                if c.mirror < mirror || start != EOF {
                    return Err(LayoutError::Mirror(format!(
                        "mirror {mirror} must reach EOF and mirror {} follow it in id order",
                        c.mirror
                    )));
                }
                (mirror, start) = (c.mirror, 0);
            }
            if c.extent_start != start || c.extent_end <= c.extent_start {
                return Err(LayoutError::Extents(format!(
                    "component {} covers [{}, {}) but should start at {}",
                    c.id, c.extent_start, c.extent_end, start
                )));
            }
            if c.extent_end != EOF && !c.extent_end.is_multiple_of(STRIPE_SIZE_UNIT) {
                return Err(LayoutError::ExtentUnaligned(c.extent_end));
            }
            if c.is_dom() && (c.extent_start != 0 || !c.osts.is_empty() || c.extent_end > DOM_SIZE_MAX) {
                return Err(LayoutError::Dom(format!("component {} is not a valid DoM component", c.id)));
            }
            if !ids.insert(c.id) {
                return Err(LayoutError::Extents(format!("component id {} appears twice", c.id)));
            }
            if !c.is_dom() {
                check_stripe_size(c.stripe_size)?;
            }
            if c.osts.len() > STRIPE_COUNT_MAX as usize {
                return Err(LayoutError::StripeCount(c.osts.len() as i64));
            }
            let mut seen = std::collections::HashSet::new();
            for &o in &c.osts {
                if !seen.insert(o) {
                    return Err(LayoutError::DuplicateOst(o));
                }
            }
            start = c.extent_end;
        }
        if mirrored && start != EOF {
            return Err(LayoutError::Mirror(format!("mirror {mirror} must reach EOF")));
        }
        Ok(())
    }

    /// Whether the layout holds mirrors (FLR): its components carry mirror ids.
    pub fn is_mirrored(&self) -> bool {
        self.components.iter().any(|c| c.mirror != 0)
    }

    /// The mirror ids, in order (`[0]` for a layout without mirrors).
    pub fn mirror_ids(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self.components.iter().map(|c| c.mirror).collect();
        ids.dedup();
        ids
    }

    /// Lustre's `lcm_mirror_count`: 1 for a layout without mirrors.
    pub fn mirror_count(&self) -> usize {
        self.mirror_ids().len()
    }

    /// The components of mirror `id` as a layout of their own, the generation kept:
    /// what a read or write through that mirror cuts its range by. A layout without
    /// mirrors is its own only mirror (0).
    pub fn mirror(&self, id: u16) -> Layout {
        let components = self.components.iter().filter(|c| c.mirror == id).cloned().collect();
        Layout { generation: self.generation, components, objects: self.objects }
    }

    /// Whether mirror `id` has no stale component over `[start, end)`.
    pub fn in_sync_over(&self, id: u16, start: u64, end: u64) -> bool {
        self.components.iter().filter(|c| c.mirror == id && c.overlaps(start, end)).all(|c| !c.is_stale())
    }

    /// The mirrors a read of `[start, end)` may use, best first: those in sync over
    /// the range, the `prefer` ones before the others, then by id.
    pub fn read_order(&self, start: u64, end: u64) -> Vec<u16> {
        let mut ids: Vec<u16> = self.mirror_ids().into_iter().filter(|&m| self.in_sync_over(m, start, end)).collect();
        let prefer = |m: u16| self.components.iter().any(|c| c.mirror == m && c.is_prefer());
        ids.sort_by_key(|&m| (!prefer(m), m));
        ids
    }

    /// Whether a write of `[start, end)` through mirror `id` needs no stale marking
    /// first: every other mirror's component over the range is already stale.
    pub fn others_stale_over(&self, id: u16, start: u64, end: u64) -> bool {
        self.components.iter().filter(|c| c.mirror != id && c.overlaps(start, end)).all(Component::is_stale)
    }

    /// Marks stale every component of the mirrors other than `id` over `[start,
    /// end)`: what a write there through mirror `id` makes of them (Lustre's write
    /// intent). Mirror `id` must exist and be in sync over the range. Returns whether
    /// anything changed (the generation is then bumped).
    pub fn mark_write(&mut self, id: u16, start: u64, end: u64) -> Result<bool, LayoutError> {
        if !self.components.iter().any(|c| c.mirror == id) {
            return Err(LayoutError::Mirror(format!("the file has no mirror {id}")));
        }
        if !self.in_sync_over(id, start, end) {
            return Err(LayoutError::Mirror(format!("mirror {id} is stale over [{start}, {end}): write another one")));
        }
        let mut changed = false;
        for c in self.components.iter_mut().filter(|c| c.mirror != id && c.overlaps(start, end)) {
            changed |= !c.is_stale();
            c.flags |= Component::STALE;
        }
        if changed {
            self.generation = self.generation.wrapping_add(1);
        }
        Ok(changed)
    }

    /// The first component id a new component of this file may take: above every id
    /// the layout holds and above its generation, which a replacement that drops
    /// components raises past their ids (see the MDS's `replace_layout`), so an id
    /// whose objects may still be waiting for destruction is never taken again.
    pub fn next_component_id(&self) -> u32 {
        let max = self.components.iter().map(|c| c.id).max().unwrap_or(0);
        max.max(self.generation).saturating_add(1)
    }

    /// Whether this is a composite layout (more than one component), printed as such.
    pub fn is_composite(&self) -> bool {
        self.components.len() > 1
    }

    /// Where the Data-on-MDT component ends, if the layout has one.
    pub fn dom_end(&self) -> Option<u64> {
        self.components.first().filter(|c| c.is_dom()).map(|c| c.extent_end)
    }

    /// Where the last component ends ([`EOF`] for a layout that reaches it).
    pub fn end(&self) -> u64 {
        self.components.last().map_or(0, |c| c.extent_end)
    }

    /// Whether the layout can change no more under a writer: it reaches EOF and every
    /// component has its objects. Until then another client may instantiate or add
    /// components, and a truncate or hole punch must ask for the layout again first.
    pub fn is_settled(&self) -> bool {
        self.end() == EOF && self.instantiated_below(EOF)
    }

    /// Index of the component holding file offset `x`, if any does.
    pub fn component_at(&self, x: u64) -> Option<usize> {
        self.components.iter().position(|c| x >= c.extent_start && x < c.extent_end)
    }

    /// Whether every byte below `end` has a component with objects: what a write or a
    /// truncate up to `end` needs before it can go to the OSTs.
    pub fn instantiated_below(&self, end: u64) -> bool {
        end <= self.end() && self.components.iter().filter(|c| c.extent_start < end).all(Component::is_instantiated)
    }

    /// Splits `[offset, offset+len)` into per-object chunks, in file order. A range
    /// that reaches a component not instantiated is an error.
    pub fn chunks(&self, offset: u64, len: u64) -> Result<Vec<Chunk>, LayoutError> {
        self.chunks_of(offset, len, false)
    }

    /// As [`Layout::chunks`], leaving out what lies in components not instantiated
    /// and past the last component: holes, for a reader.
    pub fn chunks_skipping_holes(&self, offset: u64, len: u64) -> Result<Vec<Chunk>, LayoutError> {
        self.chunks_of(offset, len, true)
    }

    fn chunks_of(&self, offset: u64, len: u64, skip_holes: bool) -> Result<Vec<Chunk>, LayoutError> {
        let end = offset.checked_add(len).ok_or(LayoutError::Overflow { offset, len })?;
        if self.components.first().is_some_and(|f| self.components.iter().any(|c| c.mirror != f.mirror)) {
            // Each byte has a place in every mirror: the caller picks one (`mirror`).
            return Err(LayoutError::Mirror("a mirrored layout is cut through one of its mirrors".into()));
        }
        let mut out = Vec::new();
        let mut x = offset;
        while x < end {
            let Some(ci) = self.component_at(x) else {
                if skip_holes {
                    break;
                }
                return Err(LayoutError::BeyondLayout(x));
            };
            let comp = &self.components[ci];
            if !comp.is_instantiated() {
                if skip_holes {
                    x = comp.extent_end.min(end);
                    continue;
                }
                return Err(LayoutError::NotInstantiated(comp.id));
            }
            let unit_end = (x / comp.stripe_size + 1).saturating_mul(comp.stripe_size);
            let piece_end = end.min(unit_end).min(comp.extent_end);
            let (stripe, object_offset) = comp.map(x);
            out.push(Chunk {
                component: ci,
                stripe,
                ost: comp.osts.get(stripe as usize).copied(),
                object_offset,
                file_offset: x,
                len: piece_end - x,
            });
            x = piece_end;
        }
        Ok(out)
    }

    /// Groups the chunks of `[offset, offset+len)` into object-contiguous runs of at
    /// most `max_run_bytes` each (one RPC each). Buffer offsets are relative to `offset`.
    pub fn object_extents(&self, offset: u64, len: u64, max_run_bytes: u64) -> Result<Vec<ObjectExtent>, LayoutError> {
        self.runs(self.chunks(offset, len)?, offset, max_run_bytes)
    }

    /// As [`Layout::object_extents`], holes left out (see
    /// [`Layout::chunks_skipping_holes`]): what a reader asks the OSTs for.
    pub fn object_extents_skipping_holes(
        &self,
        offset: u64,
        len: u64,
        max_run_bytes: u64,
    ) -> Result<Vec<ObjectExtent>, LayoutError> {
        self.runs(self.chunks_skipping_holes(offset, len)?, offset, max_run_bytes)
    }

    fn runs(&self, chunks: Vec<Chunk>, offset: u64, max_run_bytes: u64) -> Result<Vec<ObjectExtent>, LayoutError> {
        assert!(max_run_bytes > 0, "max_run_bytes must be positive");
        let mut runs: Vec<ObjectExtent> = Vec::new();
        // Open run per (component, stripe): index into `runs`.
        let mut open: std::collections::HashMap<(usize, u32), usize> = Default::default();
        for ch in chunks {
            let buf_off = ch.file_offset - offset;
            let mut remaining = ch.len;
            let mut obj_off = ch.object_offset;
            let mut b = buf_off;
            while remaining > 0 {
                let key = (ch.component, ch.stripe);
                let extend = open.get(&key).copied().filter(|&i| {
                    let r = &runs[i];
                    r.object_offset + r.len == obj_off && r.len < max_run_bytes
                });
                let idx = match extend {
                    Some(i) => i,
                    None => {
                        runs.push(ObjectExtent {
                            component: ch.component,
                            component_id: self.components[ch.component].id,
                            stripe: ch.stripe,
                            ost: ch.ost,
                            object_offset: obj_off,
                            len: 0,
                            pieces: Vec::new(),
                        });
                        open.insert(key, runs.len() - 1);
                        runs.len() - 1
                    }
                };
                let r = &mut runs[idx];
                let take = remaining.min(max_run_bytes - r.len);
                match r.pieces.last_mut() {
                    Some(last) if last.0 + last.1 == b => last.1 += take,
                    _ => r.pieces.push((b, take)),
                }
                r.len += take;
                remaining -= take;
                obj_off += take;
                b += take;
            }
        }
        Ok(runs)
    }
}

/// Checks a stripe size against Lustre's rules.
pub fn check_stripe_size(size: u64) -> Result<(), LayoutError> {
    if size == 0 || size > STRIPE_SIZE_MAX {
        return Err(LayoutError::StripeSizeRange(size));
    }
    if !size.is_multiple_of(STRIPE_SIZE_UNIT) {
        return Err(LayoutError::StripeSizeUnaligned(size));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raid0(stripe_size: u64, osts: Vec<u32>) -> Layout {
        Layout {
            generation: 0,
            components: vec![Component {
                id: 1,
                extent_start: 0,
                extent_end: EOF,
                pattern: Pattern::Raid0,
                stripe_size,
                stripe_count_wanted: osts.len() as i64,
                osts,
                pool: None,
                mirror: 0,
                flags: 0,
            }],
            objects: None,
        }
    }

    #[test]
    fn map_matches_lustre_example() {
        // 4 stripes of 1 MiB: byte 5 MiB + 3 is in stripe 1, second row.
        let l = raid0(1 << 20, vec![3, 0, 1, 2]);
        let c = &l.components[0];
        assert_eq!(c.map((5 << 20) + 3), (1, (1 << 20) + 3));
        let chunks = l.chunks((1 << 20) - 10, 20).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].ost, Some(3));
        assert_eq!(chunks[1].ost, Some(0));
        assert_eq!(chunks[1].object_offset, 0);
    }

    #[test]
    fn object_extents_merge_rows_of_one_object() {
        // 16 MiB over 4 x 1 MiB stripes: each object gets one 4 MiB run of 4 pieces.
        let l = raid0(1 << 20, vec![0, 1, 2, 3]);
        let runs = l.object_extents(0, 16 << 20, 8 << 20).unwrap();
        assert_eq!(runs.len(), 4);
        for r in &runs {
            assert_eq!(r.len, 4 << 20);
            assert_eq!(r.pieces.len(), 4);
        }
        // The RPC size bound splits runs.
        let runs = l.object_extents(0, 16 << 20, 2 << 20).unwrap();
        assert_eq!(runs.len(), 8);
    }

    #[test]
    fn uninstantiated_component_is_an_error() {
        let mut l = raid0(1 << 20, vec![0]);
        l.components[0].extent_end = 4 << 20;
        l.components.push(Component {
            id: 2,
            extent_start: 4 << 20,
            extent_end: EOF,
            pattern: Pattern::Raid0,
            stripe_size: 1 << 20,
            osts: vec![],
            stripe_count_wanted: 2,
            pool: None,
            mirror: 0,
            flags: 0,
        });
        l.validate().unwrap();
        assert!(l.chunks(0, 4 << 20).is_ok());
        assert_eq!(l.chunks(0, (4 << 20) + 1), Err(LayoutError::NotInstantiated(2)));
        assert!(l.instantiated_below(4 << 20));
        assert!(!l.instantiated_below((4 << 20) + 1));
        // A reader sees the component as a hole: only the first component's bytes.
        let read = l.object_extents_skipping_holes(0, 8 << 20, 64 << 20).unwrap();
        assert_eq!(read.iter().map(|r| r.len).sum::<u64>(), 4 << 20);
    }

    #[test]
    fn validate_rejects_bad_layouts() {
        let mut l = raid0(100_000, vec![0]);
        assert_eq!(l.validate(), Err(LayoutError::StripeSizeUnaligned(100_000)));
        l = raid0(1 << 20, vec![1, 1]);
        assert_eq!(l.validate(), Err(LayoutError::DuplicateOst(1)));
        l = raid0(1 << 20, vec![0]);
        l.components[0].extent_end = 10;
        assert_eq!(l.validate(), Err(LayoutError::ExtentUnaligned(10)));
        l.components[0].extent_end = 4 << 20;
        l.validate().expect("a layout may end before EOF");
        assert_eq!(l.chunks(4 << 20, 1), Err(LayoutError::BeyondLayout(4 << 20)));
    }

    /// Two mirrors of one component each: mirror 1 on OST 0, mirror 2 on OST 1.
    fn two_mirrors() -> Layout {
        let mut a = raid0(1 << 20, vec![0]).components.remove(0);
        a.mirror = 1;
        let b = Component { id: 65538, mirror: 2, osts: vec![1], ..a.clone() };
        Layout { generation: 3, components: vec![a, b], objects: None }
    }

    #[test]
    fn mirrors_are_runs_of_components_from_zero_to_eof_in_id_order() {
        let l = two_mirrors();
        l.validate().unwrap();
        assert!(l.is_mirrored() && !raid0(1 << 20, vec![0]).is_mirrored());
        assert_eq!((l.mirror_ids(), l.mirror_count()), (vec![1, 2], 2));
        assert_eq!(raid0(1 << 20, vec![0]).mirror_count(), 1);
        assert_eq!(l.mirror(2).components, vec![l.components[1].clone()]);
        // Out of order, short of EOF, or mixed with a component of no mirror: refused.
        let mut bad = l.clone();
        bad.components.swap(0, 1);
        assert!(matches!(bad.validate(), Err(LayoutError::Mirror(_))), "{:?}", bad.validate());
        let mut bad = l.clone();
        bad.components[0].extent_end = 4 << 20;
        assert!(bad.validate().is_err());
        let mut bad = l.clone();
        bad.components[1].mirror = 0;
        assert!(matches!(bad.validate(), Err(LayoutError::Mirror(_))));
        // A range is cut through one mirror, never the whole layout.
        assert!(matches!(l.chunks(0, 10), Err(LayoutError::Mirror(_))));
        assert_eq!(l.mirror(2).chunks(0, 10).unwrap()[0].ost, Some(1));
    }

    #[test]
    fn a_write_makes_the_other_mirrors_stale_and_reads_avoid_them() {
        let mut l = two_mirrors();
        assert_eq!(l.read_order(0, 100), vec![1, 2]);
        l.components[1].flags |= Component::PREFER;
        assert_eq!(l.read_order(0, 100), vec![2, 1], "the preferred mirror first");
        assert_eq!(l.components[1].flag_names(), "init,prefer");
        assert!(!l.others_stale_over(2, 0, 100));
        assert!(l.mark_write(2, 0, 100).unwrap(), "mirror 1 goes stale");
        assert_eq!((l.generation, l.components[0].flag_names().as_str()), (4, "init,stale"));
        assert!(l.others_stale_over(2, 0, 100));
        assert!(!l.mark_write(2, 5, 6).unwrap(), "nothing more to mark");
        assert_eq!(l.read_order(0, 100), vec![2]);
        assert!(matches!(l.mark_write(1, 0, 100), Err(LayoutError::Mirror(_))), "a stale mirror takes no write");
        assert!(matches!(l.mark_write(9, 0, 100), Err(LayoutError::Mirror(_))));
        // Ids of new components pass every id and the generation.
        assert_eq!(l.next_component_id(), 65539);
        l.generation = 70_000;
        assert_eq!(l.next_component_id(), 70_001);
    }

    fn arb_layout() -> impl Strategy<Value = Layout> {
        (1u64..=16, 1usize..=8, 0u32..8).prop_map(|(units, count, start)| {
            let osts = (0..count as u32).map(|i| (start + i) % 64).collect();
            raid0(units * STRIPE_SIZE_UNIT, osts)
        })
    }

    proptest! {
        /// Every byte maps to exactly one (stripe, object offset) and back.
        #[test]
        fn map_is_a_bijection(l in arb_layout(), x in 0u64..(1 << 40)) {
            let c = &l.components[0];
            let (stripe, off) = c.map(x);
            prop_assert!(stripe < c.stripe_count());
            prop_assert_eq!(c.file_offset(stripe, off), x);
        }

        /// Chunks tile the range exactly, in order, each inside one stripe unit, and no
        /// two chunks claim the same object byte.
        #[test]
        fn chunks_tile_the_range(l in arb_layout(), offset in 0u64..(1 << 36), len in 0u64..(8 << 20)) {
            let chunks = l.chunks(offset, len).unwrap();
            let mut x = offset;
            let mut seen = std::collections::HashSet::new();
            for ch in &chunks {
                prop_assert_eq!(ch.file_offset, x);
                prop_assert!(ch.len > 0);
                let c = &l.components[ch.component];
                prop_assert_eq!(c.map(ch.file_offset), (ch.stripe, ch.object_offset));
                prop_assert_eq!(c.map(ch.file_offset + ch.len - 1), (ch.stripe, ch.object_offset + ch.len - 1));
                prop_assert!(seen.insert((ch.stripe, ch.object_offset)));
                x += ch.len;
            }
            prop_assert_eq!(x, offset + len);
        }

        /// Object extents cover the buffer exactly once and respect the RPC bound.
        #[test]
        fn object_extents_cover_buffer(l in arb_layout(), offset in 0u64..(1 << 30), len in 1u64..(8 << 20), max in 1u64..(4 << 20)) {
            let runs = l.object_extents(offset, len, max).unwrap();
            let mut covered = vec![];
            for r in &runs {
                prop_assert!(r.len <= max);
                prop_assert_eq!(r.pieces.iter().map(|p| p.1).sum::<u64>(), r.len);
                let c = &l.components[r.component];
                let mut obj = r.object_offset;
                for &(b, n) in &r.pieces {
                    prop_assert_eq!(c.map(offset + b), (r.stripe, obj));
                    covered.push((b, n));
                    obj += n;
                }
            }
            covered.sort();
            let mut at = 0;
            for (b, n) in covered {
                prop_assert_eq!(b, at);
                at += n;
            }
            prop_assert_eq!(at, len);
        }

        /// The object sizes for a file size agree with the mapping of the file's last byte.
        #[test]
        fn object_sizes_match_mapping(l in arb_layout(), size in 0u64..(1 << 32)) {
            let c = &l.components[0];
            for stripe in 0..c.stripe_count() {
                let obj = c.object_size_for_file_size(stripe, size);
                if obj > 0 {
                    let last = c.file_offset(stripe, obj - 1);
                    prop_assert!(last < size);
                    prop_assert_eq!(c.file_size_from_object(stripe, obj), last + 1);
                }
                // No byte of this stripe below `size` lies at or beyond `obj`.
                if size > 0 {
                    let (s, o) = c.map(size - 1);
                    if s == stripe { prop_assert_eq!(o + 1, obj); }
                }
            }
        }
    }
}
