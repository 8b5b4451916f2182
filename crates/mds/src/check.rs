//! The namespace checker: reads every MDT's store (with its journal replayed, as the
//! MDS would at start) and verifies the namespace across them. The MDSs must be
//! stopped (a store has one user at a time). It is the proof the crash tests of
//! operations spanning MDTs rely on, and `braid fsck`'s namespace pass to be.
//!
//! What it verifies:
//! - every entry names an inode that exists, on the MDT its FID names, of the
//!   entry's kind;
//! - every inode but the root has an entry (or is an orphan: unlinked while open), a
//!   directory exactly one, in the directory its `..` names;
//! - a file's link count is its number of entries, a directory's is 2 plus its
//!   subdirectories;
//! - a striped directory's shards exist on the MDTs its table names, each with the
//!   same table and `..` naming shard 0, and every entry is in the shard its name
//!   hashes to;
//! - no operation spanning MDTs is left undecided.
//!
//! It holds every MDT's inodes and entries in memory: a checker for test and repair
//! sizes of namespace, not yet for a billion files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use proto::msg::FileKind;
use proto::Fid;

use crate::cluster::ClusterView;
use crate::mdt::schema::{decode_dentry, stored_index};
use crate::mdt::{Inode, OpError, Tbl};
use crate::target::Mdt;
use crate::{MdsConfig, MdsError};

/// What one MDT holds, as the checker reads it (from its store, or, online, from
/// the pages `braid fsck` asks its MDS for).
#[derive(Default)]
pub struct Contents {
    pub inodes: BTreeMap<Fid, Inode>,
    /// (directory, name) → (child, kind).
    pub entries: Vec<(Fid, String, Fid, FileKind)>,
    pub orphans: BTreeSet<Fid>,
    /// Undecided halves of operations spanning MDTs: (the inode it is kept under,
    /// what), kept on this MDT whichever MDT the inode's FID names.
    pub pending: Vec<(Fid, String)>,
    /// The objects queued for destruction: (OST, object).
    pub destroys: Vec<(u32, proto::ObjectId)>,
}

impl Contents {
    /// Takes one row of `table` as stored.
    pub fn add(&mut self, table: proto::msg::FsckTable, key: &[u8], value: &[u8]) -> Result<(), OpError> {
        use proto::msg::FsckTable;
        let fid = || Fid::from_key(key).ok_or_else(|| corrupt("a key is not a FID"));
        match table {
            FsckTable::Inodes => {
                let ino: Inode = store::decode_record(value)?;
                self.inodes.insert(Fid::from_key(key).unwrap_or(ino.attr.fid), ino);
            }
            FsckTable::Dentries => {
                let parent = fid()?;
                let name = String::from_utf8_lossy(key.get(16..).unwrap_or_default()).into_owned();
                let (child, kind) = decode_dentry(value)?;
                self.entries.push((parent, name, child, kind));
            }
            FsckTable::Orphans => {
                self.orphans.insert(fid()?);
            }
            FsckTable::Destroy => {
                let r: crate::mdt::schema::DestroyRecord = store::decode_record(value)?;
                self.destroys.extend(r.objects);
            }
        }
        Ok(())
    }
}

/// One thing wrong in a namespace; those fsck can repair say what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// An inode's link count is `has`, and should be `want`.
    LinkCount { fid: Fid, has: u32, want: u32, what: String },
    /// An entry names an inode that does not exist.
    DanglingEntry { parent: Fid, name: String, child: Fid },
    /// A directory's `..` is `has`, and its one entry is in `want`.
    Parent { fid: Fid, has: Option<Fid>, want: Fid, name: String },
    /// Anything else, said in words.
    Other(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::LinkCount { has, want, what, .. } => write!(f, "{what} has link count {has}, not {want}"),
            Problem::DanglingEntry { parent, name, child } => {
                write!(f, "entry {parent}/{name} names {child}, which does not exist")
            }
            Problem::Parent { fid, has, want, name } => {
                write!(f, "directory {fid} ({want}/{name}) has `..` {}", shown(*has))
            }
            Problem::Other(s) => f.write_str(s),
        }
    }
}

/// Checks the namespace held by the MDTs in `dirs` (all of the file system's).
/// Returns what is wrong, one line each; empty when the namespace is consistent.
pub fn check_namespace(dirs: &[PathBuf]) -> Result<Vec<String>, MdsError> {
    // By index, so that the problems come out in the same order every time.
    let mut all: BTreeMap<u32, Contents> = BTreeMap::new();
    for dir in dirs {
        let (index, contents) = read_mdt(dir)?;
        if all.insert(index, contents).is_some() {
            return Err(MdsError::Format { index, dir: dir.clone(), detail: "MDT given twice".into() });
        }
    }
    Ok(check(&all).iter().map(Problem::to_string).collect())
}

/// What is wrong in the namespace of the MDTs in `all` (every MDT of the file
/// system, by index).
pub fn check(all: &BTreeMap<u32, Contents>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let inode = |fid: Fid| all.get(&fid.mdt()).and_then(|c| c.inodes.get(&fid));
    // Entries naming each inode, the children and subdirectories of each directory.
    let mut names: HashMap<Fid, Vec<(Fid, &str)>> = HashMap::new();
    let mut children: HashMap<Fid, Vec<Fid>> = HashMap::new();
    let mut subdirs: HashMap<Fid, u32> = HashMap::new();
    let mut missing_mdts = BTreeSet::new();
    for (&index, c) in all {
        for (parent, name, child, kind) in &c.entries {
            if !all.contains_key(&child.mdt()) {
                missing_mdts.insert(child.mdt());
                continue;
            }
            if inode(*parent).is_none_or(|p| p.attr.kind != FileKind::Dir) {
                problems.push(Problem::Other(format!("entry {parent}/{name} is in a directory that does not exist")));
            }
            children.entry(*parent).or_default().push(*child);
            match inode(*child) {
                None => problems.push(Problem::DanglingEntry { parent: *parent, name: name.clone(), child: *child }),
                Some(i) if i.attr.kind != *kind => problems.push(Problem::Other(format!(
                    "entry {parent}/{name} says {kind:?}, but {child} is a {:?}",
                    i.attr.kind
                ))),
                Some(_) => {}
            }
            if let Some(s) = inode(*parent).and_then(|p| p.attr.stripes.as_ref()) {
                if s.shard_for(name) != *parent {
                    problems.push(Problem::Other(format!(
                        "entry {parent}/{name} belongs to shard {}, not this one",
                        s.shard_for(name)
                    )));
                }
            }
            names.entry(*child).or_default().push((*parent, name));
            if *kind == FileKind::Dir {
                *subdirs.entry(*parent).or_default() += 1;
            }
        }
        for (fid, what) in &c.pending {
            problems.push(Problem::Other(format!("MDT {index}: {what} of {fid} is still undecided")));
        }
    }
    for m in &missing_mdts {
        problems.push(Problem::Other(format!("entries name inodes on MDT {m}, whose directory was not given")));
    }
    // A striped directory reaches its other shards; they have no entry of their own.
    let mut shards_of: HashMap<Fid, Fid> = HashMap::new();
    for c in all.values() {
        for (fid, ino) in &c.inodes {
            let Some(s) = &ino.attr.stripes else { continue };
            if let Err(e) = s.validate() {
                problems.push(Problem::Other(format!("directory {fid} has a bad shard table: {e}")));
                continue;
            }
            if s.master() != *fid {
                match inode(s.master()) {
                    Some(m) if m.attr.stripes.as_ref() == Some(s) => {}
                    _ => problems
                        .push(Problem::Other(format!("shard {fid} is not in its directory {}'s table", s.master()))),
                }
                if ino.parent != Some(s.master()) {
                    problems.push(Problem::Other(format!(
                        "shard {fid} has `..` {}, not its directory {}",
                        shown(ino.parent),
                        s.master()
                    )));
                }
                continue;
            }
            for &shard in &s.shards[1..] {
                match inode(shard) {
                    None if !all.contains_key(&shard.mdt()) => {}
                    None => problems.push(Problem::Other(format!("shard {shard} of directory {fid} does not exist"))),
                    Some(i) if i.attr.stripes.as_ref() != Some(s) => {
                        problems.push(Problem::Other(format!("shard {shard} of directory {fid} has another table")))
                    }
                    Some(_) => {
                        children.entry(*fid).or_default().push(shard);
                        shards_of.insert(shard, *fid);
                    }
                }
            }
        }
    }
    // Everything with an entry is reachable from the root (no cycle cut off from it).
    let mut reached: BTreeSet<Fid> = BTreeSet::from([Fid::ROOT]);
    let mut todo = vec![Fid::ROOT];
    while let Some(dir) = todo.pop() {
        for child in children.get(&dir).into_iter().flatten() {
            if reached.insert(*child) {
                todo.push(*child);
            }
        }
    }
    for c in all.values() {
        for fid in c.inodes.keys() {
            if (names.contains_key(fid) || shards_of.contains_key(fid)) && !reached.contains(fid) {
                problems
                    .push(Problem::Other(format!("{fid} is not reachable from the root (a cycle, or a lost subtree)")));
            }
        }
    }
    // An inode an undecided operation holds has its entries, `..` and link count in
    // flux until the verdict: its undecided line above says so, once.
    let undecided: BTreeSet<Fid> = all.values().flat_map(|c| c.pending.iter().map(|(fid, _)| *fid)).collect();
    for c in all.values() {
        for (fid, ino) in &c.inodes {
            if *fid == Fid::ROOT || undecided.contains(fid) {
                continue;
            }
            let refs = names.get(fid).map_or(&[][..], |v| &v[..]);
            match ino.attr.kind {
                FileKind::Dir => {
                    match refs {
                        [] if shards_of.contains_key(fid) => {}
                        [] => problems.push(Problem::Other(format!("directory {fid} has no entry (lost)"))),
                        [(parent, name)] if ino.parent != Some(*parent) => problems.push(Problem::Parent {
                            fid: *fid,
                            has: ino.parent,
                            want: *parent,
                            name: name.to_string(),
                        }),
                        [_] => {}
                        more => problems.push(Problem::Other(format!("directory {fid} has {} entries", more.len()))),
                    }
                    let want = 2 + subdirs.get(fid).copied().unwrap_or(0);
                    if ino.attr.nlink != want {
                        problems.push(Problem::LinkCount {
                            fid: *fid,
                            has: ino.attr.nlink,
                            want,
                            what: format!("directory {fid}"),
                        });
                    }
                }
                _ => {
                    if refs.is_empty() && !c.orphans.contains(fid) {
                        problems.push(Problem::Other(format!(
                            "{:?} {fid} has no entry and is not an orphan",
                            ino.attr.kind
                        )));
                    }
                    if ino.attr.nlink as usize != refs.len() {
                        problems.push(Problem::LinkCount {
                            fid: *fid,
                            has: ino.attr.nlink,
                            want: refs.len() as u32,
                            what: fid.to_string(),
                        });
                    }
                }
            }
        }
    }
    if let Some(root) = inode(Fid::ROOT) {
        let want = 2 + subdirs.get(&Fid::ROOT).copied().unwrap_or(0);
        if root.attr.nlink != want {
            problems.push(Problem::LinkCount { fid: Fid::ROOT, has: root.attr.nlink, want, what: "the root".into() });
        }
    } else if !all.is_empty() {
        problems.push(Problem::Other("the root directory is missing (is MDT 0 among those given?)".into()));
    }
    problems
}

/// Opens one MDT as its MDS would (journal replayed) and reads what the checker needs.
fn read_mdt(dir: &Path) -> Result<(u32, Contents), MdsError> {
    let failed = |index: u32, e: OpError| MdsError::Format { index, dir: dir.to_path_buf(), detail: e.to_string() };
    let db = dir.join("mdt.redb");
    if !db.exists() {
        return Err(MdsError::Format {
            index: u32::MAX,
            dir: dir.to_path_buf(),
            detail: "no MDT database here".into(),
        });
    }
    let index = {
        let store = store::Store::open(&db)?;
        stored_index(&store).map_err(|e| failed(u32::MAX, e))?.ok_or_else(|| MdsError::Format {
            index: u32::MAX,
            dir: dir.to_path_buf(),
            detail: "the database names no MDT index".into(),
        })?
    };
    let cluster = Arc::new(RwLock::new(ClusterView::default()));
    let mdt = Mdt::open(index, dir, &MdsConfig::default(), cluster)?;
    let view = mdt.view().map_err(|e| failed(index, e))?;
    let mut c = Contents::default();
    let rows = |t: Tbl| view.scan(t, std::ops::Bound::Unbounded).map_err(|e| failed(index, e));
    for row in rows(Tbl::Inodes)? {
        let (k, v) = row.map_err(|e| failed(index, e))?;
        let ino: Inode = store::decode_record(&v)?;
        c.inodes.insert(Fid::from_key(&k).unwrap_or(ino.attr.fid), ino);
    }
    for row in rows(Tbl::Dentries)? {
        let (k, v) = row.map_err(|e| failed(index, e))?;
        let parent = Fid::from_key(&k).ok_or_else(|| failed(index, corrupt("an entry key is not a FID")))?;
        let name = String::from_utf8_lossy(&k[16..]).into_owned();
        let (child, kind) = decode_dentry(&v).map_err(|e| failed(index, e))?;
        c.entries.push((parent, name, child, kind));
    }
    for row in rows(Tbl::Orphans)? {
        let (k, _) = row.map_err(|e| failed(index, e))?;
        c.orphans.extend(Fid::from_key(&k));
    }
    for (fid, p) in view.pending_all(usize::MAX).map_err(|e| failed(index, e))? {
        c.pending.push((fid, format!("{:?} (coordinator MDT {}, {}/{})", p.op, p.id.mdt, p.parent, p.name)));
    }
    Ok((index, c))
}

/// A directory's `..` as a problem names it.
fn shown(parent: Option<Fid>) -> String {
    parent.map_or_else(|| "none".into(), |p| p.to_string())
}

fn corrupt(what: &str) -> OpError {
    OpError::Store(store::StoreError::Corrupt { what: "entry", detail: what.into() })
}

#[cfg(test)]
mod tests;
