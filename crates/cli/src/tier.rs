//! `braid tier`: automated hot/cool tiering (seed 002's Table 7 and Figures 11 to 13;
//! DDN's lamigo and lpurge on Lustre), a service of its own that talks to the MDS and
//! OSTs as a client and moves files with the file-level mirror commands.
//!
//! Each pass it walks the managed tree and reads every MDT's open log:
//! - a file with a hot copy and no cool one, unchanged for `mirror_age_s`, gets a
//!   mirror in the cool pool (`braid mirror extend -p cool`);
//! - a mirrored file written since (a stale component) is resynced once idle again;
//! - while the hot pool is above `high_watermark` percent used, the least recently
//!   used files with both copies in sync lose their hot copy (`braid mirror split -d`)
//!   until it is below `low_watermark`;
//! - a file with only its cool copy that another client opened since its layout last
//!   changed (the purge) is read from cool at once (the mirror's read path) and staged
//!   back to hot here, as a preferred mirror (`braid mirror extend -p hot`).
//!
//! Every move is one layout replacement at the MDS, made after its copy is whole: a
//! service killed in the middle of one leaves the file as it was (the copy's objects
//! become orphans), never a half-made mirror marked in sync, and the MDS never drops
//! the last in-sync copy of a byte. The state file (`state`, written whole and renamed
//! into place) holds only what the next pass and `braid tier status` read: where the
//! open logs were read up to, when files were last opened, the queues and the latest
//! moves.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use client::mirror::MirrorSpec;
use client::{BlockingClient, Client, Creds, Fid, FileKind};
use layout::{Layout, LayoutSpec};
use serde::{Deserialize, Serialize};

use crate::stripe::{parse_setstripe, SetstripeAction};
use crate::tools::creds;

/// Usage of `braid tier`, for its `--help`.
pub const TIER_HELP: &str = "\
Automated hot/cool tiering (seed 002, Table 7): new files land in the hot pool; a closed file idle for
mirror_age_s gets a copy in the cool pool; above the high watermark the least recently used files lose
their hot copy down to the low watermark; a file read after that is staged back to hot.

  braid tier run --policy FILE URL            the service, over the tree at URL (its own process)
  braid tier status --policy FILE             pool usage against the watermarks, queues, latest moves
  braid tier stage --policy FILE URL...       bring files to the hot pool now (burst-buffer stage-in)
  braid tier flush --policy FILE URL...       give files an in-sync cool copy now, keeping the hot one
  braid tier purge --policy FILE URL...       flush, then drop the hot copy

The policy file (TOML):
  hot_pool = \"hot\"                 cool_pool = \"cool\"
  mirror_age_s = 300               high_watermark = 80      low_watermark = 60   (percent of the hot pool)
  scan_interval_ms = 2000          state = \"tier-state.json\"  (beside the policy file)
  hot_layout = \"-E 1G -c 1 -E 16G -c 4 -E eof -c -1\"   new files' layout (setstripe options), in hot_pool
  cool_layout = \"-c 1\"             the cool copy's layout, in cool_pool
  hot_capacity = \"10G\"             optional: the hot pool's size, counting the files' hot bytes
                                   (for emulated pools whose OSTs share one disk)
Also: --secret-file FILE, --timeout-s SECONDS.";

/// The policy file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    hot_pool: String,
    cool_pool: String,
    #[serde(default = "default_mirror_age")]
    mirror_age_s: u64,
    #[serde(default = "default_high")]
    high_watermark: u8,
    #[serde(default = "default_low")]
    low_watermark: u8,
    #[serde(default = "default_scan_interval")]
    scan_interval_ms: u64,
    #[serde(default = "default_hot_layout")]
    hot_layout: String,
    #[serde(default = "default_cool_layout")]
    cool_layout: String,
    hot_capacity: Option<String>,
    state: Option<String>,
}

fn default_mirror_age() -> u64 {
    300
}
fn default_high() -> u8 {
    80
}
fn default_low() -> u8 {
    60
}
fn default_scan_interval() -> u64 {
    2000
}
/// Seed 002's Table 7: 1 stripe up to 1 GiB, 4 up to 16 GiB, then all.
fn default_hot_layout() -> String {
    "-E 1G -c 1 -E 16G -c 4 -E eof -c -1".into()
}
fn default_cool_layout() -> String {
    "-c 1".into()
}

/// A tiering policy (see [`TIER_HELP`]).
#[derive(Debug, Clone)]
pub struct Policy {
    pub hot_pool: String,
    pub cool_pool: String,
    pub mirror_age: Duration,
    pub high_watermark: u8,
    pub low_watermark: u8,
    pub scan_interval: Duration,
    /// New files' layout, its components without a pool in the hot pool.
    pub hot_layout: LayoutSpec,
    /// The cool copy's layout, in the cool pool.
    pub cool_layout: LayoutSpec,
    pub hot_capacity: Option<u64>,
    pub state: PathBuf,
}

impl Policy {
    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<Policy> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Policy::parse(&text, path.parent().unwrap_or(Path::new("."))).with_context(|| format!("{}", path.display()))
    }

    /// Parses a policy; a relative state path is taken from `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Policy> {
        let f: PolicyFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        for pool in [&f.hot_pool, &f.cool_pool] {
            proto::msg::check_pool_name(pool).map_err(|e| anyhow::anyhow!("pool '{pool}': {e}"))?;
        }
        if f.hot_pool == f.cool_pool {
            bail!("hot_pool and cool_pool are both '{}'", f.hot_pool);
        }
        if !(f.low_watermark < f.high_watermark && f.high_watermark <= 100) {
            bail!("watermarks {} (low) and {} (high): want 0 <= low < high <= 100", f.low_watermark, f.high_watermark);
        }
        let layout = |what: &str, args: &str, pool: &str| -> Result<LayoutSpec> {
            let mut argv: Vec<String> = args.split_whitespace().map(String::from).collect();
            argv.push("policy".into());
            let s = parse_setstripe(&argv).with_context(|| format!("{what} '{args}'"))?;
            let SetstripeAction::Set(mut spec) = s.action else { bail!("{what} '{args}' is not a layout") };
            for c in &mut spec.components {
                c.pool.get_or_insert_with(|| pool.to_string());
            }
            if spec.components.iter().any(|c| c.pattern == layout::Pattern::Mdt) {
                bail!("{what} '{args}': a tiered file keeps its bytes on OSTs (no -L mdt)");
            }
            Ok(spec)
        };
        let hot_capacity = match &f.hot_capacity {
            Some(s) => Some(layout::parse_size(s).with_context(|| format!("hot_capacity '{s}'"))?),
            None => None,
        };
        if hot_capacity == Some(0) {
            bail!("hot_capacity 0: the hot pool would always be full");
        }
        Ok(Policy {
            hot_layout: layout("hot_layout", &f.hot_layout, &f.hot_pool)?,
            cool_layout: layout("cool_layout", &f.cool_layout, &f.cool_pool)?,
            hot_pool: f.hot_pool,
            cool_pool: f.cool_pool,
            mirror_age: Duration::from_secs(f.mirror_age_s),
            high_watermark: f.high_watermark,
            low_watermark: f.low_watermark,
            scan_interval: Duration::from_millis(f.scan_interval_ms.max(100)),
            hot_capacity,
            state: dir.join(f.state.as_deref().unwrap_or("tier-state.json")),
        })
    }
}

/// Where a file's copies are: the mirror in each pool (0 for a file without mirrors)
/// and whether it is in sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copies {
    pub hot: Option<(u16, bool)>,
    pub cool: Option<(u16, bool)>,
}

impl Copies {
    /// Each mirror of `layout` by the pool of its first component.
    pub fn of(layout: &Layout, policy: &Policy) -> Copies {
        let mut out = Copies::default();
        for m in layout.mirror_ids() {
            let Some(first) = layout.components.iter().find(|c| c.mirror == m) else { continue };
            let in_sync = layout.components.iter().filter(|c| c.mirror == m).all(|c| !c.is_stale());
            match first.pool.as_deref() {
                Some(p) if p == policy.hot_pool => out.hot = Some((m, in_sync)),
                Some(p) if p == policy.cool_pool => out.cool = Some((m, in_sync)),
                _ => {}
            }
        }
        out
    }

    fn stale(&self) -> bool {
        self.hot.is_some_and(|h| !h.1) || self.cool.is_some_and(|c| !c.1)
    }
}

/// What the service does to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Move {
    /// A copy in the cool pool.
    Mirror,
    /// The stale copy brought up to date.
    Resync,
    /// The hot copy dropped.
    Purge,
    /// A hot copy again, preferred.
    Stage,
}

impl Move {
    fn name(self) -> &'static str {
        match self {
            Move::Mirror => "mirror",
            Move::Resync => "resync",
            Move::Purge => "purge",
            Move::Stage => "stage",
        }
    }
}

/// A file a pass found.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub parent: Fid,
    pub name: String,
    pub fid: Fid,
    pub size: u64,
    /// The latest of its mtime and ctime (Unix milliseconds): a purge or any change.
    pub changed: u64,
    /// When another client last opened it (Unix milliseconds), as far as the open
    /// logs told.
    pub opened: Option<u64>,
    pub copies: Copies,
}

impl Seen {
    fn used(&self) -> u64 {
        self.changed.max(self.opened.unwrap_or(0))
    }
}

/// The moves a pass makes, in order: resyncs, mirrors and stages first, then the
/// purges that bring the hot pool from above its high watermark to its low one
/// (`hot_used` of `hot_total` bytes), least recently used first. Once above the high
/// watermark the pool is `purging` until it is down to the low one, also across
/// passes (files mirrored later are purged then), as lpurge's two thresholds work.
pub fn plan(
    files: &[Seen],
    (hot_used, hot_total): (u64, u64),
    purging: bool,
    policy: &Policy,
    now: u64,
) -> Vec<(Move, usize)> {
    let idle = |f: &Seen| now.saturating_sub(f.changed) >= policy.mirror_age.as_millis() as u64;
    let mut moves = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let c = f.copies;
        if c.stale() && idle(f) && c.hot.is_some() && c.cool.is_some() {
            moves.push((Move::Resync, i));
        } else if c.hot.is_some_and(|h| h.1) && c.cool.is_none() && f.size > 0 && idle(f) {
            moves.push((Move::Mirror, i));
        } else if c.hot.is_none() && c.cool.is_some_and(|c| c.1) && f.opened.is_some_and(|at| at > f.changed) {
            moves.push((Move::Stage, i));
        }
    }
    let goal = hot_total * u64::from(policy.low_watermark) / 100;
    let above_high = hot_used * 100 > hot_total * u64::from(policy.high_watermark);
    if hot_total > 0 && (above_high || purging && hot_used > goal) {
        let mut candidates: Vec<usize> = (0..files.len())
            .filter(|&i| {
                let c = files[i].copies;
                c.hot.is_some_and(|h| h.1) && c.cool.is_some_and(|c| c.1) && c.hot != c.cool
            })
            .collect();
        candidates.sort_by_key(|&i| (files[i].used(), files[i].fid));
        let mut used = hot_used;
        for i in candidates {
            if used <= goal {
                break;
            }
            moves.push((Move::Purge, i));
            used = used.saturating_sub(files[i].size);
        }
    }
    moves
}

/// One move made, for `status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Done {
    pub at: u64,
    pub path: String,
    pub what: Move,
    pub ok: bool,
    pub detail: String,
    pub ms: u64,
}

/// What the service keeps between passes, and shows through `status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    /// Per MDT, the last open-log number read.
    pub open_log: HashMap<u32, u64>,
    /// FID (as printed) -> when another client last opened it (Unix milliseconds).
    pub opened: HashMap<String, u64>,
    /// The client ids this service ran as lately: their opens (its own moves') are
    /// not reads, also those a service killed mid-pass left in the log unread.
    #[serde(default)]
    pub clients: VecDeque<u64>,
    pub updated: u64,
    pub files: usize,
    pub hot_used: u64,
    pub hot_total: u64,
    /// Moves the last pass planned, by kind, and those left when it ended.
    pub queued: HashMap<String, usize>,
    /// The hot pool went above its high watermark and is not down to its low one yet.
    #[serde(default)]
    pub purging: bool,
    pub latest: VecDeque<Done>,
}

/// Most moves `status` lists.
const LATEST_MAX: usize = 32;
/// Most files whose last open is remembered (those not seen again go first).
const OPENED_MAX: usize = 1 << 20;
/// How many of the service's past client ids it keeps (one per start).
const CLIENTS_KEPT: usize = 8;

impl State {
    fn load(path: &Path) -> Result<State> {
        match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).with_context(|| format!("{}: not a tier state file", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the state whole, then renames it into place.
    fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} into place", tmp.display()))
    }
}

fn now_secs() -> u64 {
    now_ms() / 1000
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A file time in Unix milliseconds (0 before 1970).
fn millis(t: client::Timespec) -> u64 {
    (t.sec.max(0) as u64).saturating_mul(1000) + u64::from(t.nsec / 1_000_000)
}

/// Makes `m` of file `name` in `parent`, as the policy says. Returns what was done.
async fn make_move(
    cl: &Client,
    c: &Creds,
    policy: &Policy,
    parent: Fid,
    name: &str,
    m: Move,
    copies: Copies,
) -> client::Result<String> {
    match m {
        Move::Mirror => {
            let spec = MirrorSpec { layout: policy.cool_layout.clone(), prefer: false };
            cl.mirror_extend(c, parent, name, &[spec]).await.map(|_| "cool copy made".into())
        }
        Move::Resync => cl.mirror_resync(c, parent, name).await.map(|_| "resynced".into()),
        Move::Stage => {
            let spec = MirrorSpec { layout: policy.hot_layout.clone(), prefer: true };
            cl.mirror_extend(c, parent, name, &[spec]).await.map(|_| "hot copy made".into())
        }
        Move::Purge => {
            let Some((hot, _)) = copies.hot else { return Ok("no hot copy".into()) };
            cl.mirror_split(c, parent, name, hot, None).await.map(|_| "hot copy dropped".into())
        }
    }
}

/// Every regular file under `root` (a directory of `root_path`), with what the
/// open logs said of it.
async fn scan(
    cl: &Client,
    c: &Creds,
    root: Fid,
    root_path: &str,
    policy: &Policy,
    state: &State,
) -> client::Result<Vec<Seen>> {
    let mut out = Vec::new();
    let mut dirs = vec![(root, root_path.trim_end_matches('/').to_string())];
    while let Some((dir, path)) = dirs.pop() {
        let mut after: Option<String> = None;
        loop {
            let (batch, eof) = cl.readdir_plus(c, dir, after.as_deref(), 1024).await?;
            after = batch.last().map(|(e, _)| e.name.clone());
            for (e, attr) in batch {
                let p = format!("{path}/{}", e.name);
                match e.kind {
                    FileKind::Dir => dirs.push((e.fid, p)),
                    FileKind::File => {
                        let a = match attr {
                            Some(a) => a,
                            None => match cl.getattr(e.fid).await {
                                Ok(a) => a,
                                Err(_) => continue, // gone since the listing
                            },
                        };
                        let Some(layout) = a.layout.as_ref() else { continue };
                        out.push(Seen {
                            path: p,
                            parent: dir,
                            name: e.name,
                            fid: e.fid,
                            size: a.size,
                            changed: millis(a.mtime).max(millis(a.ctime)),
                            opened: state.opened.get(&e.fid.to_string()).copied(),
                            copies: Copies::of(layout, policy),
                        });
                    }
                    _ => {}
                }
            }
            if eof || after.is_none() {
                break;
            }
        }
    }
    Ok(out)
}

/// Reads every MDT's open log since the last pass into `state.opened`, leaving out
/// this client's own opens (its moves open the files they move).
async fn read_open_logs(cl: &Client, state: &mut State) -> client::Result<()> {
    let me = cl.client_id();
    if !state.clients.contains(&me) {
        state.clients.push_back(me);
        while state.clients.len() > CLIENTS_KEPT {
            state.clients.pop_front();
        }
    }
    for t in cl.config().mdts.iter().filter(|t| t.up) {
        // A service that never read this MDT's log starts at its end, as a changelog
        // reader registered now would: opens from before it ran are not its business.
        let fresh = !state.open_log.contains_key(&t.index);
        let mut after = state.open_log.get(&t.index).copied().unwrap_or(0);
        loop {
            let (_, next, opens) = cl.open_log(t.index, after).await?;
            for o in opens.iter().filter(|o| !fresh && !state.clients.contains(&o.client)) {
                let at = state.opened.entry(o.fid.to_string()).or_default();
                *at = (*at).max(millis(o.at));
            }
            after = next.saturating_sub(1);
            if opens.len() < proto::msg::OPEN_LOG_BATCH {
                break;
            }
        }
        state.open_log.insert(t.index, after);
    }
    Ok(())
}

/// Bytes used and in all of the hot pool: its OSTs' own, or the files' hot bytes
/// against `hot_capacity`.
async fn hot_usage(cl: &Client, policy: &Policy, files: &[Seen]) -> client::Result<(u64, u64)> {
    if let Some(cap) = policy.hot_capacity {
        let used = files.iter().filter(|f| f.copies.hot.is_some()).map(|f| f.size).sum();
        return Ok((used, cap));
    }
    let config = cl.config();
    let pool = config.pool(&policy.hot_pool).map(|p| p.osts.clone()).unwrap_or_default();
    let mut used = 0;
    let mut total = 0;
    for (t, u) in cl.target_usage().await? {
        if t.kind == client::TargetKind::Ost && pool.contains(&t.index) {
            if let Ok(u) = u {
                used += u.total_bytes.saturating_sub(u.free_bytes);
                total += u.total_bytes;
            }
        }
    }
    Ok((used, total))
}

/// `braid tier run`: passes over the tree at `url` until killed.
pub fn run(policy: &Policy, bc: &BlockingClient, root_path: &str) -> Result<()> {
    let c = creds();
    let cl = &bc.client;
    let root = bc.run(cl.resolve(&c, root_path, true)).with_context(|| format!("{root_path}: the tree to tier"))?;
    if root.kind != FileKind::Dir {
        bail!("{root_path}: braid tier runs over a directory");
    }
    for pool in [&policy.hot_pool, &policy.cool_pool] {
        if cl.config().pool(pool).is_none_or(|p| p.osts.is_empty()) {
            bail!("pool '{pool}' has no OSTs (or does not exist: see braid pool list)");
        }
    }
    // New files land in the hot pool, in the policy's layout.
    bc.run(cl.set_dir_layout(&c, root.fid, Some(policy.hot_layout.clone())))
        .with_context(|| format!("{root_path}: setting the hot layout as its default"))?;
    let mut state = State::load(&policy.state)?;
    // The line a supervisor (or a test) waits for.
    println!("tiering {root_path} (state in {})", policy.state.display());
    tracing::info!(root = root_path, state = %policy.state.display(), "tiering");
    loop {
        let started = Instant::now();
        if let Err(e) = bc.run(pass(cl, &c, policy, root.fid, root_path, &mut state)) {
            tracing::warn!("a tiering pass failed (the next one tries again): {e}");
        }
        state.save(&policy.state)?;
        std::thread::sleep(policy.scan_interval.saturating_sub(started.elapsed()));
    }
}

/// One pass: scan, plan, move, and note what happened in `state`.
async fn pass(
    cl: &Client,
    c: &Creds,
    policy: &Policy,
    root: Fid,
    root_path: &str,
    state: &mut State,
) -> client::Result<()> {
    read_open_logs(cl, state).await?;
    let files = scan(cl, c, root, root_path, policy, state).await?;
    if state.opened.len() > OPENED_MAX {
        let seen: std::collections::HashSet<String> = files.iter().map(|f| f.fid.to_string()).collect();
        state.opened.retain(|fid, _| seen.contains(fid));
    }
    let (hot_used, hot_total) = hot_usage(cl, policy, &files).await?;
    let moves = plan(&files, (hot_used, hot_total), state.purging, policy, now_ms());
    let goal = hot_total * u64::from(policy.low_watermark) / 100;
    state.purging = (state.purging || hot_used * 100 > hot_total * u64::from(policy.high_watermark)) && hot_used > goal;
    state.files = files.len();
    (state.hot_used, state.hot_total) = (hot_used, hot_total);
    state.queued.clear();
    for (m, _) in &moves {
        *state.queued.entry(m.name().into()).or_default() += 1;
    }
    for (m, i) in moves {
        let f = &files[i];
        let t = Instant::now();
        let r = make_move(cl, c, policy, f.parent, &f.name, m, f.copies).await;
        let ms = t.elapsed().as_millis() as u64;
        match &r {
            Ok(d) => tracing::info!(path = %f.path, what = m.name(), ms, "{d}"),
            Err(e) => tracing::warn!(path = %f.path, what = m.name(), "not moved: {e}"),
        }
        if let Some(n) = state.queued.get_mut(m.name()) {
            *n -= 1;
        }
        if m == Move::Purge && r.is_ok() {
            state.hot_used = state.hot_used.saturating_sub(f.size);
        }
        let (ok, detail) = match r {
            Ok(d) => (true, d),
            Err(e) => (false, e.to_string()),
        };
        state.latest.push_back(Done { at: now_secs(), path: f.path.clone(), what: m, ok, detail, ms });
        while state.latest.len() > LATEST_MAX {
            state.latest.pop_front();
        }
    }
    // Past this pass's own opens, so that a restart does not take them for reads.
    read_open_logs(cl, state).await?;
    // Down to the low watermark: purging stops until the high one is passed again.
    state.purging &= state.hot_used > goal;
    state.updated = now_secs();
    Ok(())
}

/// `braid tier status`: what the state file says, and the hot pool against the
/// watermarks.
pub fn status(policy: &Policy) -> Result<String> {
    let s = State::load(&policy.state)?;
    if s.updated == 0 {
        bail!("{}: no pass recorded yet (is braid tier run running?)", policy.state.display());
    }
    let pct = |u: u64, t: u64| if t == 0 { 0.0 } else { u as f64 * 100.0 / t as f64 };
    let mut out = String::new();
    let ago = now_secs().saturating_sub(s.updated);
    out += &format!("tiering: {} file(s) at the last pass, {ago} s ago\n", s.files);
    out += &format!(
        "hot pool '{}': {} of {} used ({:.1}%), purging above {}% down to {}%\n",
        policy.hot_pool,
        layout::format_size(s.hot_used),
        layout::format_size(s.hot_total),
        pct(s.hot_used, s.hot_total),
        policy.high_watermark,
        policy.low_watermark
    );
    let q = |k: &str| s.queued.get(k).copied().unwrap_or(0);
    out +=
        &format!("queued: mirror {} resync {} stage {} purge {}\n", q("mirror"), q("resync"), q("stage"), q("purge"));
    out += "latest moves:\n";
    for d in s.latest.iter().rev() {
        let outcome = if d.ok { "ok" } else { "failed" };
        out += &format!("  {} {} {} {outcome} ({} ms): {}\n", d.at, d.what.name(), d.path, d.ms, d.detail);
    }
    Ok(out)
}

/// `braid tier stage|flush|purge` of one file, made now.
pub fn explicit(policy: &Policy, bc: &BlockingClient, what: &str, path: &str) -> Result<String> {
    let c = creds();
    let cl = &bc.client;
    let a = bc.run(cl.resolve(&c, path, true))?;
    if a.kind != FileKind::File {
        bail!("{path}: braid tier {what} moves regular files");
    }
    let (parent, name) = bc.run(cl.resolve_parent(&c, path))?;
    let copies = |bc: &BlockingClient| -> Result<Copies> {
        let a = bc.run(cl.getattr(a.fid))?;
        Ok(Copies::of(a.layout.as_ref().context("no layout")?, policy))
    };
    let mut done = Vec::new();
    let mut step = |m: Move, now: Copies| -> Result<()> {
        done.push(bc.run(make_move(cl, &c, policy, parent.fid, &name, m, now))?);
        Ok(())
    };
    let now = copies(bc)?;
    match what {
        "stage" => match now.hot {
            None => step(Move::Stage, now)?,
            Some((_, false)) => step(Move::Resync, now)?,
            Some(_) => {}
        },
        "flush" | "purge" => {
            match now.cool {
                None => step(Move::Mirror, now)?,
                Some((_, false)) => step(Move::Resync, now)?,
                Some(_) => {}
            }
            let now = copies(bc)?;
            if what == "purge" && now.hot.is_some() {
                step(Move::Purge, now)?;
            }
        }
        other => bail!("unknown tier command '{other}'"),
    }
    Ok(if done.is_empty() { "nothing to do".into() } else { done.join(", ") })
}

/// Runs `braid tier ARGS`.
pub fn main(args: &[String]) -> Result<()> {
    let Some((sub, rest)) = args.split_first() else { bail!("{TIER_HELP}") };
    let (client, rest) = crate::tools::take_client_opts(rest)?;
    let mut policy = None;
    let mut paths = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--policy" => policy = Some(PathBuf::from(it.next().context("--policy needs a value")?)),
            p if p.starts_with("--policy=") => policy = Some(PathBuf::from(&p["--policy=".len()..])),
            f if f.starts_with('-') => bail!("unknown tier option '{f}' (see braid tier --help)"),
            p => paths.push(p.to_string()),
        }
    }
    let policy = Policy::load(&policy.context("braid tier needs --policy FILE")?)?;
    match sub.as_str() {
        "run" => {
            let [url] = &paths[..] else { bail!("braid tier run takes the URL of the tree to tier") };
            crate::tools::with_client(&client, url, |bc, p| run(&policy, bc, &p.path))
        }
        "status" => {
            if !paths.is_empty() {
                bail!("braid tier status takes no paths (it reads the policy's state file)");
            }
            print!("{}", status(&policy)?);
            Ok(())
        }
        "stage" | "flush" | "purge" => {
            if paths.is_empty() {
                bail!("braid tier {sub} takes files");
            }
            for url in &paths {
                let done = crate::tools::with_client(&client, url, |bc, p| explicit(&policy, bc, sub, &p.path))
                    .with_context(|| url.clone())?;
                println!("{url}: {done}");
            }
            Ok(())
        }
        other => bail!("unknown tier command '{other}' (run, status, stage, flush, purge)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(extra: &str) -> Policy {
        Policy::parse(&format!("hot_pool = \"hot\"\ncool_pool = \"cool\"\nmirror_age_s = 60\n{extra}"), Path::new("/x"))
            .unwrap()
    }

    #[test]
    fn a_policy_reads_with_its_defaults_and_a_typo_is_a_clear_error() {
        let p = policy("");
        assert_eq!((p.high_watermark, p.low_watermark), (80, 60));
        assert_eq!(p.hot_layout.components.len(), 3, "Table 7's three size classes");
        assert!(p.hot_layout.components.iter().all(|c| c.pool.as_deref() == Some("hot")));
        assert_eq!(p.cool_layout.components[0].pool.as_deref(), Some("cool"));
        assert_eq!(p.state, Path::new("/x/tier-state.json"));
        let err = |text: &str| Policy::parse(text, Path::new(".")).unwrap_err().to_string();
        let base = "hot_pool = \"hot\"\ncool_pool = \"cool\"\n";
        assert!(err(&format!("{base}hgh_watermark = 9")).contains("unknown field `hgh_watermark`"));
        assert!(err(&format!("{base}high_watermark = 50\nlow_watermark = 70")).contains("want 0 <= low < high"));
        assert!(err(&format!("{base}hot_layout = \"-c x\"")).contains("hot_layout"));
        assert!(err(&format!("{base}hot_layout = \"-E 64K -L mdt -E -1\"")).contains("no -L mdt"));
        assert!(err("hot_pool = \"a\"\ncool_pool = \"a\"").contains("both 'a'"));
        assert!(err("hot_pool = \"hot\"").contains("cool_pool"));
        assert!(err(&format!("{base}hot_capacity = \"lots\"")).contains("hot_capacity"));
    }

    fn seen(i: u64, size: u64, changed: u64, copies: Copies) -> Seen {
        let fid = Fid::new(0, 1, i as u32);
        Seen {
            path: format!("/f{i}"),
            parent: Fid::ROOT,
            name: format!("f{i}"),
            fid,
            size,
            changed,
            opened: None,
            copies,
        }
    }

    #[test]
    fn idle_files_are_mirrored_stale_ones_resynced_read_ones_staged_and_the_coldest_purged() {
        let p = policy("");
        let hot = Copies { hot: Some((0, true)), cool: None };
        let both = Copies { hot: Some((1, true)), cool: Some((2, true)) };
        let stale = Copies { hot: Some((1, true)), cool: Some((2, false)) };
        let purged = Copies { hot: None, cool: Some((2, true)) };
        let mut files = vec![
            seen(1, 10, 1_000_000, hot),    // idle: mirrored
            seen(2, 10, 1_990_000, hot),    // written 10 s ago: not yet
            seen(3, 10, 1_000_000, stale),  // resynced
            seen(4, 10, 1_000_000, purged), // not read since: stays cool
            seen(5, 10, 1_000_000, purged), // read since: staged
        ];
        files[3].opened = Some(1_000_000); // read as it was purged: not after
        files[4].opened = Some(1_000_001);
        let moves = plan(&files, (0, 100), false, &p, 2_000_000);
        assert_eq!(moves, vec![(Move::Mirror, 0), (Move::Resync, 2), (Move::Stage, 4)]);

        // Above 80% of 100: the least recently used purged first, down to 60%.
        let mut files: Vec<Seen> = (0..5).map(|i| seen(i, 10, 1000 + i, both)).collect();
        files[0].opened = Some(5000); // read lately: kept
        let moves = plan(&files, (90, 100), false, &p, 9000);
        assert_eq!(moves, vec![(Move::Purge, 1), (Move::Purge, 2), (Move::Purge, 3)]);
        assert!(plan(&files, (80, 100), false, &p, 9000).is_empty(), "at the high watermark, not above it");
        // Once purging, below the high watermark and above the low one it goes on.
        assert_eq!(plan(&files, (70, 100), true, &p, 9000), vec![(Move::Purge, 1)]);
        assert!(plan(&files, (60, 100), true, &p, 9000).is_empty(), "down to the low watermark");
        // Only files with both copies in sync lose their hot one.
        files.iter_mut().for_each(|f| f.copies = stale);
        assert!(plan(&files, (90, 100), false, &p, 1010).iter().all(|(m, _)| *m != Move::Purge));
    }
}
