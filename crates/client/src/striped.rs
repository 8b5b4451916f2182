//! Striped directories on the client: which shard holds a name, the shard tables this
//! client learned, a listing merged over the shards, and the directory's attributes
//! summed over them.
//!
//! A striped directory (`braid mkdir -c N`) keeps entry `name` in shard
//! `hash(name) % N`, each shard a directory object on its own MDT, shard 0 being the
//! directory itself. The client sends every operation on an entry straight to its
//! shard's MDT, so creates in one directory spread over the MDTs with no hop through
//! shard 0 (Lustre's LMV, as its clients do). It learns a table from any attributes
//! that carry one (a lookup or getattr of the directory); one it has not learned yet,
//! or forgot, comes back from shard 0 as [`Response::Striped`] in place of the answer,
//! and the request goes again to the right shard.
//!
//! What a user sees of the directory is the sum of its shards: its listing merges
//! theirs in name order (each shard lists in name order, so resuming after a name
//! works across all of them, and a listing under concurrent creates neither repeats
//! nor skips a name that existed throughout), its link count is 2 plus the
//! subdirectories of every shard, and its times are the latest of any shard's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proto::msg::{Attr, Creds, DirEntry, DirStripes, Request, Response};
use proto::{Errno, Fid};

use crate::{unexpected, Client, ClientError, Result};

/// Most shard tables a client remembers; past that it forgets them all (a forgotten
/// table costs one redirected request to learn again).
const TABLES_MAX: usize = 4096;

/// Most times one request is sent again to another shard (a table learned, then
/// perhaps a second directory's, for a rename).
const REDIRECTS_MAX: usize = 3;

/// A striped directory's attributes as users see them, from shard 0's (`master`)
/// and the other shards': the link count counts every shard's subdirectories, the
/// times are the latest of any.
pub(crate) fn merge_dir_attr(master: Attr, shards: &[Attr]) -> Attr {
    let mut merged = master;
    for s in shards {
        merged.nlink = (merged.nlink + s.nlink).saturating_sub(2);
        merged.mtime = merged.mtime.max(s.mtime);
        merged.ctime = merged.ctime.max(s.ctime);
        merged.atime = merged.atime.max(s.atime);
        merged.size += s.size;
    }
    merged
}

/// The shard tables of the striped directories this client met.
#[derive(Default)]
pub(crate) struct StripeTables {
    tables: Mutex<HashMap<Fid, Arc<DirStripes>>>,
    /// Whether any table was learned: a client that never met a striped directory
    /// (one MDT, or plain directories) takes no lock on every entry operation.
    any: std::sync::atomic::AtomicBool,
}

impl StripeTables {
    fn get(&self, dir: Fid) -> Option<Arc<DirStripes>> {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.tables.lock().expect("stripe tables").get(&dir).cloned()
    }

    /// Remembers `stripes` (a table that does not validate is ignored: the MDT
    /// checks every name anyway).
    fn learn(&self, stripes: &DirStripes) {
        if stripes.validate().is_err() {
            return;
        }
        let mut t = self.tables.lock().expect("stripe tables");
        if t.len() >= TABLES_MAX {
            t.clear();
        }
        t.insert(stripes.master(), Arc::new(stripes.clone()));
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Client {
    /// The shard of directory `dir` that holds `name`: `dir` itself unless it is a
    /// striped directory this client knows of.
    pub(crate) fn shard(&self, dir: Fid, name: &str) -> Fid {
        self.inner.stripes.get(dir).map_or(dir, |s| s.shard_for(name))
    }

    /// Learns the table of a striped directory from its attributes, if they carry one.
    pub(crate) fn learn_stripes(&self, attr: &Attr) {
        if let Some(s) = attr.stripes.as_ref().filter(|s| s.master() == attr.fid) {
            self.inner.stripes.learn(s);
        }
    }

    /// Sends the request `build(shard)` makes for entry `name` of directory `dir` to
    /// the MDT of the shard holding it; a striped directory this client did not know
    /// of answers with its table, and the request goes to the right shard.
    pub(crate) async fn md_entry(&self, dir: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<rpc::Reply> {
        self.md_entries2((dir, name), None, |a, _| build(a)).await
    }

    /// As [`Client::md_entry`] for a request naming entries of two directories (a
    /// rename): `build(first shard, second shard)`, sent to the second one's MDT.
    pub(crate) async fn md_entries2(
        &self,
        (dir, name): (Fid, &str),
        second: Option<(Fid, &str)>,
        build: impl Fn(Fid, Fid) -> Request,
    ) -> Result<rpc::Reply> {
        let mut redirects = 0;
        loop {
            let a = self.shard(dir, name);
            let b = second.map(|(d, n)| self.shard(d, n));
            let reply = self.md_reply(b.unwrap_or(a), build(a, b.unwrap_or(a))).await?;
            match &reply.response {
                Response::Striped(s) if redirects < REDIRECTS_MAX => {
                    self.inner.stripes.learn(s);
                    redirects += 1;
                }
                Response::Striped(s) => {
                    let why = format!("directory {} sent the request to another shard too often", s.master());
                    return Err(ClientError::Errno(Errno::Io, why));
                }
                _ => return Ok(reply),
            }
        }
    }

    /// A striped directory's attributes as users see them, from shard 0's: its link
    /// count counts the subdirectories of every shard, its times are the latest of
    /// any. Anything else is returned as it is.
    pub(crate) async fn dir_attr_merged(&self, attr: Attr) -> Result<Attr> {
        let Some(stripes) = attr.stripes.clone().filter(|s| s.master() == attr.fid) else { return Ok(attr) };
        self.inner.stripes.learn(&stripes);
        let asks: Vec<_> = stripes
            .shards
            .iter()
            .skip(1)
            .map(|&fid| {
                let c = self.clone();
                tokio::spawn(rpc::stats::in_current_job(async move { c.md(fid, Request::MdsGetattr { fid }).await }))
            })
            .collect();
        let mut shards = Vec::with_capacity(asks.len());
        for ask in asks {
            let r = ask.await.map_err(|e| ClientError::Errno(Errno::Io, format!("a shard's getattr failed: {e}")))?;
            match r? {
                Response::Attr(s) => shards.push(s),
                r => return Err(unexpected("getattr", &r)),
            }
        }
        // Each shard's attributes as now, for the mount's next look at the directory
        // (see [`Client::recent_dir_attr`]).
        self.note_dir(attr.clone());
        shards.iter().cloned().for_each(|s| self.note_dir(s));
        Ok(merge_dir_attr(attr, &shards))
    }

    /// [`Client::readdir`] with the attributes a lookup of each entry would return
    /// (FUSE's `READDIRPLUS`), from one request; `None` for an entry the MDS leaves to
    /// a lookup (its inode on another MDT, a striped directory) and for every entry of
    /// a striped directory.
    pub async fn readdir_plus(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> Result<(Vec<proto::msg::DirEntryPlus>, bool)> {
        self.observe("readdirplus", Some(fid), 0, 0, async {
            if self.inner.stripes.get(fid).is_none() {
                let max = max.clamp(1, proto::msg::READDIR_MAX);
                let req = Request::MdsReaddirPlus { creds: creds.clone(), fid, after: after.map(str::to_string), max };
                match self.md(fid, req).await? {
                    Response::DirentsPlus { entries, eof } => {
                        entries.iter().filter_map(|(_, a)| a.as_ref()).for_each(|a| self.inner.first_bytes.note(a));
                        return Ok((entries, eof));
                    }
                    Response::Striped(s) => self.inner.stripes.learn(&s),
                    r => return Err(unexpected("readdirplus", &r)),
                }
            }
            let (entries, eof) = self.readdir_merged(creds, fid, after, max).await?;
            Ok((entries.into_iter().map(|e| (e, None)).collect(), eof))
        })
        .await
    }

    /// One batch of directory `fid`'s entries after `after` (name order), merged over
    /// its shards if it is striped: every shard is asked for `max` entries after
    /// `after` at once, and the first `max` names of all their answers are the batch.
    pub(crate) async fn readdir_merged(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        // Each shard answers at most this many: a batch of more would skip names.
        let max = max.clamp(1, proto::msg::READDIR_MAX);
        let read = |shard: Fid, whole: bool| {
            let req = Request::MdsReaddir {
                creds: creds.clone(),
                fid: shard,
                after: after.map(str::to_string),
                max,
                shard: whole,
            };
            let c = self.clone();
            async move { c.md(shard, req).await }
        };
        let stripes = match self.inner.stripes.get(fid) {
            Some(s) => s,
            None => match read(fid, false).await? {
                Response::Dirents { entries, eof } => return Ok((entries, eof)),
                Response::Striped(s) => {
                    self.inner.stripes.learn(&s);
                    self.inner.stripes.get(fid).ok_or_else(|| {
                        ClientError::Errno(Errno::Io, format!("directory {fid} answered a bad shard table"))
                    })?
                }
                r => return Err(unexpected("readdir", &r)),
            },
        };
        let asks: Vec<_> =
            stripes.shards.iter().map(|&s| tokio::spawn(rpc::stats::in_current_job(read(s, true)))).collect();
        let mut all = Vec::new();
        let mut eof = true;
        for ask in asks {
            let r = ask.await.map_err(|e| ClientError::Errno(Errno::Io, format!("a shard's readdir failed: {e}")))?;
            match r? {
                Response::Dirents { entries, eof: shard_eof } => {
                    // A shard not at its end may hold names before the others' next
                    // ones: the batch ends before its last name.
                    eof &= shard_eof;
                    all.extend(entries);
                }
                r => return Err(unexpected("readdir", &r)),
            }
        }
        all.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let max = max as usize;
        if all.len() > max {
            all.truncate(max);
            eof = false;
        }
        Ok((all, eof))
    }
}
