//! `braid fsck`: checks (and with `--repair`, repairs) the consistency of MDTs and
//! OSTs online, with the file system mounted and in use, as Lustre's LFSCK does.
//!
//! The checker reads every MDT's inodes, entries, orphans and destroy queue from its
//! MDS (`MdsFsckScan`, page by page) and every OST's objects from its OSS
//! (`OstFsckList`), then reads the MDTs again. The namespace is checked with the
//! offline checker's rules (`mds::check`) over each pass, and a problem is reported
//! only if both passes show it: an operation in flight between two pages is not a
//! problem. Objects are compared with the layouts:
//! - an orphan is an object whose file exists in neither pass (and is not an open
//!   unlinked file, nor queued for destruction), or whose file's layout, the same in
//!   both passes, does not name it on that OST;
//! - a dangling object is one a layout (the same in both passes, with the same size)
//!   names on an OST that was listed, that is not there, and that would hold bytes
//!   under the file's size: those bytes now read as zeros. (braid makes an object at
//!   its first write, so a file written with holes over whole stripes shows here too:
//!   the ranges say which bytes are meant.)
//!
//! Repairs: link counts and `..` set right, entries naming nothing removed, each only
//! if still so when the MDS applies it (`MdsFsckRepair`); orphan objects moved to
//! their OST's `lost+found/` (or destroyed with `--destroy-orphans`); a missing
//! object made again empty (as LFSCK's `--create-ostobj`: its bytes are gone and
//! read as zeros either way, and the layout is whole again). An MDT or OST that
//! cannot be read is reported and nothing of it is judged or touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mds::check::{Contents, Problem};
use proto::msg::{Creds, FsckFix, FsckObjects, FsckRows, FsckTable, Request, Response};
use proto::{Fid, ObjectId};
use rpc::{Identity, RpcClient, RpcOptions};

use crate::tools::Pace;

/// Rows and objects asked for per page.
const PAGE: u32 = 4096;

/// What `braid fsck` was asked to do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub repair: bool,
    /// Orphan objects are destroyed instead of moved to `lost+found/`.
    pub destroy_orphans: bool,
    /// Most rows and objects read per second (LFSCK's `--speed`), so that a check
    /// leaves the servers to the file system's users; 0: as fast as they answer.
    pub speed_limit: u64,
}

/// The default `--speed-limit`: a million files' two passes in about 80 s, on a
/// fraction of the MDS's time (unlimited, a check took most of a 2-core machine).
pub const DEFAULT_SPEED_LIMIT: u64 = 50_000;

/// One finding, as printed and as `--json` gives it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// `link_count`, `dangling_entry`, `parent`, `namespace`, `orphan_object`,
    /// `dangling_object`, `unchecked`.
    pub kind: &'static str,
    pub detail: String,
    /// The file it concerns, by path, where one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Whether `--repair` repaired it (`None`: not asked, or nothing to repair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repaired: Option<bool>,
    #[serde(skip)]
    action: Option<Action>,
}

#[derive(Debug, Clone)]
enum Action {
    Fix(FsckFix),
    Orphan {
        ost: u32,
        object: ObjectId,
    },
    /// An empty object made where one is missing (as LFSCK's `--create-ostobj`):
    /// its bytes read as zeros either way; the layout is whole again.
    Recreate {
        ost: u32,
        object: ObjectId,
    },
}

/// What a run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub mdts: usize,
    pub osts: usize,
    pub inodes: usize,
    pub entries: usize,
    pub objects: usize,
    /// Objects queued for destruction on the MDTs (destroyed in the background).
    pub destroy_queue: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether anything is wrong (or could not be checked) and was not repaired.
    pub fn clean(&self) -> bool {
        self.findings.iter().all(|f| f.repaired == Some(true))
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "fsck: {} MDT(s), {} OST(s): {} inodes, {} entries, {} objects; {} object(s) queued for destruction\n",
            self.mdts, self.osts, self.inodes, self.entries, self.objects, self.destroy_queue
        );
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for f in &self.findings {
            *counts.entry(f.kind).or_default() += 1;
        }
        if counts.is_empty() {
            out.push_str("no problems found\n");
        } else {
            let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
            out.push_str(&format!("found: {}\n", summary.join(", ")));
        }
        for f in &self.findings {
            let path = f.path.as_deref().map(|p| format!(" [{p}]")).unwrap_or_default();
            let state = match f.repaired {
                Some(true) => " (repaired)",
                Some(false) => " (NOT repaired)",
                None => "",
            };
            out.push_str(&format!("  {}: {}{path}{state}\n", f.kind, f.detail));
        }
        out
    }
}

/// The servers fsck talks to.
struct Cluster {
    mdts: BTreeMap<u32, Arc<RpcClient>>,
    /// OST index → its OSS, if the MGS has it up.
    osts: BTreeMap<u32, Option<Arc<RpcClient>>>,
}

async fn connect(mgs: &str, secret: proto::auth::Secret) -> Result<Cluster> {
    let identity = Identity::with_tls("admin", secret, crate::client_tls(None)?);
    let opts = RpcOptions {
        recovery_timeout: Duration::from_secs(20),
        request_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let mut clients: HashMap<String, Arc<RpcClient>> = HashMap::new();
    let mut client = |addr: &str| {
        clients
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(RpcClient::new(addr.to_string(), identity.clone(), opts.clone())))
            .clone()
    };
    let m = client(mgs);
    let cfg = match m.call(&Request::MgsGetConfig, vec![]).await.with_context(|| format!("the MGS at {mgs}"))?.response
    {
        Response::Config(c) => c,
        other => bail!("the MGS at {mgs} answered {other:?} to a configuration request"),
    };
    let mdts = cfg.mdts.iter().map(|t| (t.index, client(&t.address))).collect();
    let osts = cfg.osts.iter().map(|t| (t.index, t.up.then(|| client(&t.address)))).collect();
    Ok(Cluster { mdts, osts })
}

async fn data(rpc: &RpcClient, req: &Request) -> Result<bytes::Bytes> {
    let r = rpc.call(req, vec![]).await?;
    match r.response {
        Response::Data => Ok(r.payload),
        other => bail!("{} answered {other:?} to {}", rpc.addr(), req.op_name()),
    }
}

/// Every row of every table fsck reads, of MDT `mdt`.
async fn scan_mdt(rpc: &RpcClient, mdt: u32, pace: &mut Pace) -> Result<Contents> {
    let mut c = Contents::default();
    for table in [FsckTable::Inodes, FsckTable::Dentries, FsckTable::Orphans, FsckTable::Destroy] {
        let mut after = None;
        loop {
            let req = Request::MdsFsckScan { mdt, table, after: after.clone(), max: PAGE };
            let page: FsckRows = proto::msg::decode(&data(rpc, &req).await?)?;
            for (k, v) in &page.rows {
                c.add(table, k, v).map_err(|e| anyhow::anyhow!("MDT{mdt:04x}, a {table:?} row: {e}"))?;
            }
            pace.took(page.rows.len()).await;
            if page.done || page.rows.is_empty() {
                break;
            }
            after = page.rows.last().map(|(k, _)| k.clone());
        }
    }
    Ok(c)
}

/// Every object of OST `ost`, with its size.
async fn list_ost(rpc: &RpcClient, ost: u32, pace: &mut Pace) -> Result<BTreeMap<ObjectId, u64>> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let page: FsckObjects = proto::msg::decode(&data(rpc, &Request::OstFsckList { ost, after, max: PAGE }).await?)?;
        let last = page.objects.last().map(|(o, _)| *o);
        pace.took(page.objects.len()).await;
        out.extend(page.objects);
        if page.done || last.is_none() {
            return Ok(out);
        }
        after = last;
    }
}

/// A pass over every MDT: their contents, and those that could not be read.
async fn scan_all(c: &Cluster, pace: &mut Pace) -> (BTreeMap<u32, Contents>, Vec<(u32, String)>) {
    let mut all = BTreeMap::new();
    let mut failed = Vec::new();
    for (&i, rpc) in &c.mdts {
        match scan_mdt(rpc, i, pace).await {
            Ok(contents) => {
                all.insert(i, contents);
            }
            Err(e) => failed.push((i, format!("{e:#}"))),
        }
    }
    (all, failed)
}

/// Paths of inodes, from the entries of a pass (for the report).
fn paths(all: &BTreeMap<u32, Contents>) -> HashMap<Fid, String> {
    let mut up: HashMap<Fid, (Fid, &str)> = HashMap::new();
    for c in all.values() {
        for (parent, name, child, _) in &c.entries {
            up.entry(*child).or_insert((*parent, name));
        }
    }
    // A striped directory's shards hang under it without an entry: their entries'
    // paths go through the directory itself.
    let mut shard_of: HashMap<Fid, Fid> = HashMap::new();
    for c in all.values() {
        for (fid, ino) in &c.inodes {
            if let Some(s) = &ino.attr.stripes {
                if s.master() != *fid {
                    shard_of.insert(*fid, s.master());
                }
            }
        }
    }
    let mut out = HashMap::new();
    for &fid in up.keys() {
        let mut parts = Vec::new();
        let mut at = fid;
        for _ in 0..256 {
            let Some(&(parent, name)) = up.get(&at) else { break };
            parts.push(name);
            at = shard_of.get(&parent).copied().unwrap_or(parent);
            if at == Fid::ROOT {
                parts.reverse();
                out.insert(fid, format!("/{}", parts.join("/")));
                break;
            }
        }
    }
    out
}

/// The bytes under `size` that `stripe` of component `c` holds, as ranges (at most
/// `shown` of them) and their total. Computed, not walked: a dangling object of a
/// terabyte file costs as little as one of a kilobyte file.
fn stripe_ranges(c: &layout::Component, stripe: u32, size: u64, shown: usize) -> (Vec<(u64, u64)>, u64) {
    let (start, end) = (c.extent_start, c.extent_end.min(size));
    let (s, n, k) = (c.stripe_size.max(1), c.osts.len().max(1) as u64, u64::from(stripe));
    if start >= end || k >= n {
        return (Vec::new(), 0);
    }
    // Stripe units (of `s` bytes, counted from the file's start) that reach into
    // [start, end); the stripe holds every n-th, from its first one on.
    let (first, past) = (start / s, end.div_ceil(s));
    let mine = first + (k + n - first % n) % n;
    if mine >= past {
        return (Vec::new(), 0);
    }
    let last = mine + (past - 1 - mine) / n * n;
    // Saturating: a size near 2^64 (a hostile or damaged inode) must not overflow.
    let at = |u: u64| u.saturating_mul(s);
    let clip = |u: u64| (at(u).max(start), at(u + 1).min(end));
    let units = (last - mine) / n + 1;
    let total = at(units) - (clip(mine).0 - at(mine)) - (at(last + 1) - clip(last).1);
    let ranges = if n == 1 {
        // One stripe holds every unit: one range.
        vec![(clip(mine).0, clip(last).1)].into_iter().take(shown).collect()
    } else {
        (0..units.min(shown as u64)).map(|i| clip(mine + i * n)).collect()
    };
    (ranges, total)
}

/// Checks the file system at `mgs`; repairs what `opts` asks.
pub async fn fsck(mgs: &str, secret: proto::auth::Secret, opts: Options) -> Result<Report> {
    let c = connect(mgs, secret).await?;
    let mut pace = Pace::new(opts.speed_limit);
    let (first, failed_first) = scan_all(&c, &mut pace).await;
    let mut objects: BTreeMap<u32, BTreeMap<ObjectId, u64>> = BTreeMap::new();
    let mut findings = Vec::new();
    let unchecked = |detail: String| Finding { kind: "unchecked", detail, path: None, repaired: None, action: None };
    for (&ost, rpc) in &c.osts {
        match rpc {
            None => findings.push(unchecked(format!("OST{ost:04x} is down: its objects were not checked"))),
            Some(rpc) => match list_ost(rpc, ost, &mut pace).await {
                Ok(list) => {
                    objects.insert(ost, list);
                }
                Err(e) => findings.push(unchecked(format!("OST{ost:04x} could not be listed ({e:#}): not checked"))),
            },
        }
    }
    let (second, failed_second) = scan_all(&c, &mut pace).await;
    for (i, e) in failed_first.iter().chain(&failed_second) {
        findings.push(unchecked(format!("MDT{i:04x} could not be read ({e}): nothing was judged")));
    }
    let whole = failed_first.is_empty() && failed_second.is_empty();
    let names = paths(&second);
    let path_of = |fid: &Fid| names.get(fid).cloned();

    // The namespace: what both passes show.
    if whole {
        let again: BTreeSet<String> = mds::check::check(&second).iter().map(Problem::to_string).collect();
        for p in mds::check::check(&first).into_iter().filter(|p| again.contains(&p.to_string())) {
            let (kind, fid, action) = match &p {
                Problem::LinkCount { fid, has, want, .. } => {
                    ("link_count", Some(*fid), Some(FsckFix::LinkCount { fid: *fid, was: *has, nlink: *want }))
                }
                Problem::DanglingEntry { parent, name, child } => (
                    "dangling_entry",
                    Some(*parent),
                    Some(FsckFix::DropEntry { parent: *parent, name: name.clone(), child: *child }),
                ),
                Problem::Parent { fid, has, want, .. } => {
                    ("parent", Some(*fid), Some(FsckFix::Parent { fid: *fid, was: *has, parent: *want }))
                }
                Problem::Other(_) => ("namespace", None, None),
            };
            findings.push(Finding {
                kind,
                detail: p.to_string(),
                path: fid.as_ref().and_then(path_of),
                repaired: None,
                action: action.map(Action::Fix),
            });
        }
    }

    // Objects against layouts, where both passes read every MDT.
    let inode = |all: &BTreeMap<u32, Contents>, fid: Fid| all.get(&fid.mdt()).and_then(|c| c.inodes.get(&fid)).cloned();
    let spared: BTreeSet<(u32, ObjectId)> =
        first.values().chain(second.values()).flat_map(|c| c.destroys.iter().copied()).collect();
    let open_unlinked: BTreeSet<Fid> =
        first.values().chain(second.values()).flat_map(|c| c.orphans.iter().copied()).collect();
    let stable = |fid: Fid| match (inode(&first, fid), inode(&second, fid)) {
        (Some(a), Some(b)) if a.attr.layout == b.attr.layout && a.attr.size == b.attr.size => Some(b),
        _ => None,
    };
    // A file moved to another MDT keeps its objects under the FID it had
    // (`Layout::objects`): each pass's owner of such an object FID.
    let owners = |all: &BTreeMap<u32, Contents>| -> BTreeMap<Fid, Fid> {
        let files = all.values().flat_map(|c| c.inodes.iter());
        files.filter_map(|(&fid, ino)| Some((Fid::from(ino.attr.layout.as_ref()?.objects?), fid))).collect()
    };
    let (owners_first, owners_second) = (owners(&first), owners(&second));
    let file_of = |owners: &BTreeMap<Fid, Fid>, of: Fid| owners.get(&of).copied().unwrap_or(of);
    if whole {
        for (&ost, list) in &objects {
            for &o in list.keys() {
                let (was, is) = (file_of(&owners_first, o.fid), file_of(&owners_second, o.fid));
                if spared.contains(&(ost, o)) || open_unlinked.contains(&was) || open_unlinked.contains(&is) {
                    continue;
                }
                let named = |ino: &mds::inode::Inode| {
                    ino.attr.layout.as_ref().is_some_and(|l| {
                        proto::objects_fid(is, l) == o.fid
                            && l.components
                                .iter()
                                .any(|c| c.id == o.component && c.osts.get(o.stripe as usize) == Some(&ost))
                    })
                };
                let why = match (inode(&first, was), inode(&second, is)) {
                    (None, None) => Some(format!("its file {} does not exist", o.fid)),
                    (Some(a), Some(b)) if was == is && a.attr.layout == b.attr.layout && !named(&b) => {
                        Some(format!("the layout of {is} does not name it"))
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    findings.push(Finding {
                        kind: "orphan_object",
                        detail: format!("OST{ost:04x} object {} ({} bytes): {why}", o.file_name(), list[&o]),
                        path: path_of(&is),
                        repaired: None,
                        action: Some(Action::Orphan { ost, object: o }),
                    });
                }
            }
        }
        for contents in second.values() {
            for &fid in contents.inodes.keys() {
                let Some(ino) = stable(fid) else { continue };
                let Some(layout) = &ino.attr.layout else { continue };
                for comp in layout.components.iter().filter(|c| !c.is_dom()) {
                    for (stripe, &ost) in comp.osts.iter().enumerate() {
                        let o = ObjectId::of(fid, layout, comp.id, stripe as u32);
                        let Some(list) = objects.get(&ost) else { continue };
                        if list.contains_key(&o) {
                            continue;
                        }
                        let (ranges, total) = stripe_ranges(comp, stripe as u32, ino.attr.size, 4);
                        if total == 0 {
                            continue;
                        }
                        let shown: Vec<String> = ranges.iter().map(|(a, b)| format!("[{a}, {b})")).collect();
                        findings.push(Finding {
                            kind: "dangling_object",
                            detail: format!(
                                "{fid}: object {} on OST{ost:04x} is missing; {total} bytes read as zeros: {}{}",
                                o.file_name(),
                                shown.join(" "),
                                if total > ranges.iter().map(|(a, b)| b - a).sum::<u64>() { " ..." } else { "" }
                            ),
                            path: path_of(&fid),
                            repaired: None,
                            action: Some(Action::Recreate { ost, object: o }),
                        });
                    }
                }
            }
        }
    }

    if opts.repair {
        let root = Creds::root();
        for f in findings.iter_mut() {
            let Some(action) = f.action.clone() else { continue };
            let done = match action {
                Action::Fix(fix) => {
                    let Some(rpc) = c.mdts.get(&fix.fid().mdt()) else { continue };
                    let r = rpc.call(&Request::MdsFsckRepair { creds: root.clone(), fix }, vec![]).await;
                    if let Err(e) = &r {
                        tracing::warn!("fsck: {} not repaired: {e}", f.detail);
                    }
                    r.is_ok()
                }
                Action::Orphan { ost, object } => {
                    let Some(Some(rpc)) = c.osts.get(&ost) else { continue };
                    let req = if opts.destroy_orphans {
                        Request::OstDestroy { ost, object }
                    } else {
                        Request::OstFsckLostFound { ost, object }
                    };
                    rpc.call(&req, vec![]).await.is_ok()
                }
                Action::Recreate { ost, object } => {
                    let Some(Some(rpc)) = c.osts.get(&ost) else { continue };
                    let req = Request::OstWrite { ost, object, offset: 0, sync: true };
                    rpc.call(&req, vec![]).await.is_ok()
                }
            };
            f.repaired = Some(done);
        }
    }
    let objects_total = objects.values().map(|l| l.len()).sum();
    Ok(Report {
        mdts: c.mdts.len(),
        osts: c.osts.len(),
        inodes: second.values().map(|c| c.inodes.len()).sum(),
        entries: second.values().map(|c| c.entries.len()).sum(),
        objects: objects_total,
        destroy_queue: second.values().map(|c| c.destroys.len()).sum(),
        findings,
    })
}

/// `braid fsck`: prints the report; an error (exit status 1) if anything is wrong
/// and was not repaired.
pub fn run(url: &str, secret: proto::auth::Secret, opts: Options, json: bool) -> Result<()> {
    let p = crate::url::require(url)?;
    let rt = crate::runtime()?;
    let report = rt.block_on(fsck(&p.mgs, secret, opts))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if !report.clean() {
        let left = report.findings.iter().filter(|f| f.repaired != Some(true)).count();
        let hint = if opts.repair { "" } else { " (braid fsck --repair repairs what it can)" };
        return Err(crate::ProblemsFound(format!("{left} problem(s) left{hint}")).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripe_holds_every_nth_unit_under_the_size() {
        let c = layout::Component {
            id: 1,
            extent_start: 0,
            extent_end: layout::EOF,
            pattern: layout::Pattern::Raid0,
            stripe_size: 1 << 20,
            osts: vec![3, 5],
            stripe_count_wanted: 2,
            pool: None,
            mirror: 0,
            flags: 0,
        };
        let mib = 1u64 << 20;
        assert_eq!(stripe_ranges(&c, 1, 4 * mib, 8), (vec![(mib, 2 * mib), (3 * mib, 4 * mib)], 2 * mib));
        assert_eq!(stripe_ranges(&c, 0, mib / 2, 8), (vec![(0, mib / 2)], mib / 2));
        assert_eq!(stripe_ranges(&c, 1, mib, 8).1, 0, "nothing of stripe 1 under 1 MiB");
        let (shown, total) = stripe_ranges(&c, 0, 100 * mib, 2);
        assert_eq!((shown.len(), total), (2, 50 * mib));
        let (_, total) = stripe_ranges(&c, 1, u64::MAX, 1);
        assert!(total > 0, "a huge size neither overflows nor loops");
    }

    /// The computed ranges are those a walk over every stripe unit finds.
    #[test]
    fn stripe_ranges_match_a_walk_over_the_units() {
        fn walk(c: &layout::Component, stripe: u32, size: u64, shown: usize) -> (Vec<(u64, u64)>, u64) {
            let end = c.extent_end.min(size);
            let (s, n) = (c.stripe_size, c.osts.len() as u64);
            let (mut ranges, mut total): (Vec<(u64, u64)>, u64) = (Vec::new(), 0);
            let mut unit = c.extent_start / s;
            while unit * s < end {
                let (a, b) = ((unit * s).max(c.extent_start), ((unit + 1) * s).min(end));
                if unit % n == u64::from(stripe) && a < b {
                    total += b - a;
                    let room = ranges.len() < shown;
                    match ranges.last_mut() {
                        Some(last) if last.1 == a => last.1 = b,
                        _ if room => ranges.push((a, b)),
                        _ => {}
                    }
                }
                unit += 1;
            }
            (ranges, total)
        }
        for count in 1..=4usize {
            for (start, ext_end) in [(0, layout::EOF), (0, 7000), (3000, 20000), (4096, 8192), (5000, 5001)] {
                let c = layout::Component {
                    id: 1,
                    extent_start: start,
                    extent_end: ext_end,
                    pattern: layout::Pattern::Raid0,
                    stripe_size: 1024,
                    osts: (0..count as u32).collect(),
                    stripe_count_wanted: count as i64,
                    pool: None,
                    mirror: 0,
                    flags: 0,
                };
                for stripe in 0..count as u32 {
                    for size in [0, 1, 1023, 1024, 1025, 2500, 4096, 4999, 5000, 5001, 9000, 30000] {
                        for shown in [0, 1, 3, 100] {
                            assert_eq!(
                                stripe_ranges(&c, stripe, size, shown),
                                walk(&c, stripe, size, shown),
                                "stripes {count}, extent {start}..{ext_end}, stripe {stripe}, size {size}, shown {shown}"
                            );
                        }
                    }
                }
            }
        }
    }
}
