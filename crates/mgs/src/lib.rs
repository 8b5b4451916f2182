//! The MGS: the cluster's registry.
//!
//! Targets (MDTs, OSTs) register here and receive a stable index; the registry lives
//! in the store (`mgs.redb`) so indices survive restarts. Targets heartbeat with their usage; a
//! target silent for longer than the heartbeat timeout is reported down, and up again
//! once it heartbeats. Clients and MDSs fetch the whole configuration from here alone
//! (no configuration file is ever copied to a client).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::msg::{ClusterConfig, Media, PoolInfo, PoolOp, Request, Response, TargetInfo, TargetKind, Usage};
use proto::squash::RootSquash;
use proto::Errno;
use rpc::server::{Answer, RequestCtx, Service};
use serde::{Deserialize, Serialize};
use store::{Batch, Record, Store, StoreError, Table};

/// Registered targets: `kind:index` (UTF-8) → [`TargetRecord`].
const TARGETS: Table = Table::new("targets", 0);
/// `fsname` → the file system's name (UTF-8); `format` → u64 LE.
const META: Table = Table::new("meta", 1);
/// Pool name (UTF-8) → [`PoolRecord`].
const POOLS: Table = Table::new("pools", 2);

/// The database format this release writes. Format 0 (before versioned records)
/// keyed both tables by strings and had no version byte in its records.
const FORMAT: u64 = 1;

#[derive(Debug, Clone)]
pub struct MgsConfig {
    pub data_dir: PathBuf,
    pub fsname: String,
    /// A target not heard from for this long is down.
    pub heartbeat_timeout: Duration,
    /// Root squash for every MDS and client (`braid mgs --root-squash`).
    pub root_squash: Option<RootSquash>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TargetRecord {
    kind: TargetKind,
    index: u32,
    uuid: String,
    address: String,
}

impl Record for TargetRecord {
    const WHAT: &'static str = "target";
    const VERSION: u8 = 1;
}

/// An OST pool: its OSTs, ascending.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PoolRecord {
    osts: Vec<u32>,
}

impl Record for PoolRecord {
    const WHAT: &'static str = "pool";
    const VERSION: u8 = 1;
}

/// Brings a registry of an earlier format to [`FORMAT`], or refuses a later one.
fn upgrade(b: &mut Batch) -> Result<(), StoreError> {
    if b.has_string_keyed("meta")? {
        let meta = b.take_string_keyed("meta")?;
        let targets = b.take_string_keyed("targets")?;
        b.create(&[TARGETS, META, POOLS])?;
        for (k, v) in meta {
            b.put(META, k.as_bytes(), &v)?;
        }
        for (k, v) in targets {
            b.put(TARGETS, k.as_bytes(), &store::seal(1, &v))?;
        }
        b.put(META, b"format", &FORMAT.to_le_bytes())?;
        tracing::info!("upgraded the MGS registry from format 0 to {FORMAT}");
        return Ok(());
    }
    b.create(&[TARGETS, META, POOLS])?;
    match b.get(META, b"format")? {
        None => b.put(META, b"format", &FORMAT.to_le_bytes()),
        Some(v) => {
            let format = v.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(u64::MAX);
            if format > FORMAT {
                return Err(StoreError::Format(format!(
                    "the MGS registry is in format {format}, written by a later braid; this one reads up to {FORMAT}"
                )));
            }
            Ok(())
        }
    }
}

struct Live {
    last_seen: Instant,
    usage: Usage,
    media: Option<Media>,
}

struct State {
    targets: BTreeMap<(u8, u32), TargetRecord>,
    live: HashMap<(u8, u32), Live>,
    pools: BTreeMap<String, PoolRecord>,
    generation: u64,
    /// The last epoch each replicated MDT registered with (its leader's Raft term),
    /// kept in memory: after a restart of the MGS the next leader's registration
    /// sets it again.
    epochs: HashMap<(u8, u32), u64>,
}

fn key(kind: TargetKind, index: u32) -> (u8, u32) {
    (kind as u8, index)
}

fn record_key(kind: TargetKind, index: u32) -> String {
    format!("{}:{index:08}", kind.name())
}

pub struct Mgs {
    cfg: MgsConfig,
    store: Store,
    state: Mutex<State>,
}

#[derive(Debug, thiserror::Error)]
pub enum MgsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("MGS data directory {path}: {detail}")]
    DataDir { path: PathBuf, detail: String },
    #[error("this MGS holds file system '{stored}', not '{asked}'")]
    FsName { stored: String, asked: String },
}

impl Mgs {
    /// Opens (or formats) the MGS registry in `cfg.data_dir`.
    pub fn open(cfg: MgsConfig) -> Result<Mgs, MgsError> {
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| MgsError::DataDir { path: cfg.data_dir.clone(), detail: e.to_string() })?;
        let store = Store::open(&cfg.data_dir.join("mgs.redb"))?;
        let mut targets = BTreeMap::new();
        let mut b = store.batch(true)?;
        upgrade(&mut b)?;
        match b.get(META, b"fsname")? {
            Some(name) => {
                let name = String::from_utf8_lossy(&name).to_string();
                if name != cfg.fsname {
                    return Err(MgsError::FsName { stored: name, asked: cfg.fsname.clone() });
                }
            }
            None => b.put(META, b"fsname", cfg.fsname.as_bytes())?,
        }
        for (_, v) in b.rows(TARGETS)? {
            let rec: TargetRecord = store::decode_record(&v)?;
            targets.insert(key(rec.kind, rec.index), rec);
        }
        let mut pools = BTreeMap::new();
        for (k, v) in b.rows(POOLS)? {
            pools.insert(String::from_utf8_lossy(&k).to_string(), store::decode_record::<PoolRecord>(&v)?);
        }
        b.commit()?;
        tracing::info!(fsname = %cfg.fsname, targets = targets.len(), "MGS registry opened");
        // A restarted MGS has heard no heartbeat yet: presume every registered target
        // alive for one timeout, as it was before the restart; one that really stopped
        // is marked down when that timeout passes without a heartbeat.
        let now = Instant::now();
        let live =
            targets.keys().map(|k| (*k, Live { last_seen: now, usage: Usage::default(), media: None })).collect();
        Ok(Mgs { cfg, store, state: Mutex::new(State { targets, live, pools, generation: 1, epochs: HashMap::new() }) })
    }

    fn persist(&self, rec: &TargetRecord) -> Result<(), StoreError> {
        let mut b = self.store.batch(true)?;
        b.put(TARGETS, record_key(rec.kind, rec.index).as_bytes(), &store::encode_record(rec))?;
        b.commit()
    }

    fn register(
        &self,
        kind: TargetKind,
        uuid: String,
        index: Option<u32>,
        address: String,
        fsname: String,
        epoch: u64,
    ) -> Response {
        if fsname != self.cfg.fsname {
            return Response::error(
                Errno::Inval,
                format!(
                    "the server says its file system is '{fsname}', but this MGS serves '{}': give it --fsname {} \
                     (or fsname in braid.toml), or point it at the MGS of '{fsname}'",
                    self.cfg.fsname, self.cfg.fsname
                ),
            );
        }
        if uuid.is_empty() || uuid.len() > 128 || address.len() > 256 {
            return Response::error(Errno::Inval, "target uuid or address missing or too long");
        }
        let mut st = self.state.lock().expect("mgs state");
        let existing = st.targets.values().find(|r| r.kind == kind && r.uuid == uuid).cloned();
        let rec = match (existing, index) {
            (Some(r), Some(i)) if r.index != i => {
                return Response::error(
                    Errno::Inval,
                    format!("{} {uuid} is registered as index {} but claims index {i}", kind.name(), r.index),
                )
            }
            // Two OSS processes on one OST directory (or on a copy of it) would take
            // the OST from each other at every registration: while the one it is
            // registered to is heard from, another is asked to wait (its registration
            // is retried, and goes through once the first is marked down: an OSS
            // restarted elsewhere). MDTs move between addresses on purpose
            // (failover, replicas) and are fenced by MMP and terms instead.
            (Some(r), _)
                if kind == TargetKind::Ost
                    && r.address != address
                    && st
                        .live
                        .get(&key(kind, r.index))
                        .is_some_and(|l| l.last_seen.elapsed() < self.cfg.heartbeat_timeout) =>
            {
                return Response::error(
                    Errno::Again,
                    format!(
                        "{}{:04x} ({uuid}) is served from {}, which is up: is a second OSS running on the same \
                         OST directory, or on a copy of it? Stop one of them (an OSS that moved registers once \
                         the old address is marked down)",
                        kind.name(),
                        r.index,
                        r.address
                    ),
                );
            }
            (Some(mut r), _) => {
                let last = st.epochs.get(&key(kind, r.index)).copied().unwrap_or(0);
                if epoch < last {
                    return Response::error(
                        Errno::Stale,
                        format!(
                            "{}{:04x} was registered by its leader of term {last}; this registration is of term {epoch}",
                            kind.name(),
                            r.index
                        ),
                    );
                }
                r.address = address;
                r
            }
            (None, Some(i)) => {
                if let Some(other) = st.targets.get(&key(kind, i)) {
                    return Response::error(
                        Errno::Exist,
                        format!("{} index {i} is already held by target {}", kind.name(), other.uuid),
                    );
                }
                TargetRecord { kind, index: i, uuid, address }
            }
            (None, None) => {
                let next = (0..).find(|i| !st.targets.contains_key(&key(kind, *i))).expect("a free index");
                TargetRecord { kind, index: next, uuid, address }
            }
        };
        if let Err(e) = self.persist(&rec) {
            return Response::error(Errno::Io, format!("cannot record registration: {e}"));
        }
        tracing::info!(target = %format!("{}{:04x}", rec.kind.name(), rec.index), address = %rec.address, "target registered");
        let index = rec.index;
        if epoch > 0 {
            st.epochs.insert(key(kind, index), epoch);
        }
        let media = st.live.get(&key(kind, index)).and_then(|l| l.media.clone());
        st.live.insert(key(kind, index), Live { last_seen: Instant::now(), usage: Usage::default(), media });
        st.targets.insert(key(kind, index), rec);
        st.generation += 1;
        Response::Registered { index }
    }

    fn heartbeat(&self, kind: TargetKind, index: u32, uuid: &str, usage: Usage, media: Option<Media>) -> Response {
        let mut st = self.state.lock().expect("mgs state");
        match st.targets.get(&key(kind, index)) {
            Some(r) if r.uuid == uuid => {}
            _ => {
                return Response::error(
                    Errno::Stale,
                    format!("{} {index} is not registered; register first", kind.name()),
                )
            }
        }
        let before = st.live.get(&key(kind, index));
        let was_up = before.map(|l| l.last_seen.elapsed() < self.cfg.heartbeat_timeout);
        let media_changed = before.is_none_or(|l| l.media != media);
        if was_up != Some(true) {
            tracing::info!("{}{index:04x} is up", kind.name());
        }
        if was_up != Some(true) || media_changed {
            st.generation += 1;
        }
        st.live.insert(key(kind, index), Live { last_seen: Instant::now(), usage, media });
        Response::Ok
    }

    /// Creates, fills, empties or destroys an OST pool, as Lustre's `lctl pool_*`:
    /// a pool is created empty; only registered OSTs join it, each once; a pool is
    /// destroyed only once empty. Files placed in a pool keep their layouts whatever
    /// happens to it later.
    fn pool(&self, fsname: &str, name: &str, op: PoolOp, osts: &[u32]) -> Response {
        if fsname != self.cfg.fsname {
            return Response::error(
                Errno::NoEnt,
                format!("no file system '{fsname}' here: this MGS serves '{}'", self.cfg.fsname),
            );
        }
        if let Err(e) = proto::msg::check_pool_name(name) {
            return Response::error(Errno::Inval, e);
        }
        let mut st = self.state.lock().expect("mgs state");
        let full = format!("{fsname}.{name}");
        let mut pool = match (op, st.pools.get(name)) {
            (PoolOp::Create, Some(_)) => return Response::error(Errno::Exist, format!("pool {full} already exists")),
            (PoolOp::Create, None) => PoolRecord::default(),
            (_, None) => return Response::error(Errno::NoEnt, format!("pool {full} does not exist")),
            (_, Some(p)) => p.clone(),
        };
        match op {
            PoolOp::Create => {}
            PoolOp::Add => {
                if osts.is_empty() {
                    return Response::error(Errno::Inval, "name the OSTs to add");
                }
                for &i in osts {
                    if !st.targets.contains_key(&key(TargetKind::Ost, i)) {
                        return Response::error(Errno::NoEnt, format!("OST{i:04x} is not registered in {fsname}"));
                    }
                    if pool.osts.contains(&i) {
                        return Response::error(Errno::Exist, format!("OST{i:04x} is already in pool {full}"));
                    }
                    pool.osts.push(i);
                }
                pool.osts.sort_unstable();
                pool.osts.dedup();
            }
            PoolOp::Remove => {
                if osts.is_empty() {
                    return Response::error(Errno::Inval, "name the OSTs to remove");
                }
                for &i in osts {
                    let Some(at) = pool.osts.iter().position(|&o| o == i) else {
                        return Response::error(Errno::NoEnt, format!("OST{i:04x} is not in pool {full}"));
                    };
                    pool.osts.remove(at);
                }
            }
            PoolOp::Destroy => {
                if !pool.osts.is_empty() {
                    return Response::error(
                        Errno::NotEmpty,
                        format!("pool {full} still has {} OST(s): remove them first", pool.osts.len()),
                    );
                }
            }
        }
        let stored = (|| {
            let mut b = self.store.batch(true)?;
            match op {
                PoolOp::Destroy => b.del(POOLS, name.as_bytes())?,
                _ => b.put(POOLS, name.as_bytes(), &store::encode_record(&pool))?,
            }
            b.commit()
        })();
        if let Err(e) = stored {
            return Response::error(Errno::Io, format!("cannot record pool {full}: {e}"));
        }
        match op {
            PoolOp::Destroy => {
                st.pools.remove(name);
            }
            _ => {
                st.pools.insert(name.to_string(), pool);
            }
        }
        st.generation += 1;
        tracing::info!(pool = %full, "pool {op:?} {osts:?}");
        Response::Ok
    }

    /// The configuration as clients see it now.
    pub fn config(&self) -> ClusterConfig {
        let st = self.state.lock().expect("mgs state");
        let mut mdts = Vec::new();
        let mut osts = Vec::new();
        for (k, r) in &st.targets {
            let live = st.live.get(k);
            let info = TargetInfo {
                kind: r.kind,
                index: r.index,
                uuid: r.uuid.clone(),
                address: r.address.clone(),
                up: live.is_some_and(|l| l.last_seen.elapsed() < self.cfg.heartbeat_timeout),
                usage: live.map(|l| l.usage).unwrap_or_default(),
                media: live.and_then(|l| l.media.clone()),
            };
            match r.kind {
                TargetKind::Mdt => mdts.push(info),
                TargetKind::Ost => osts.push(info),
            }
        }
        let pools = st.pools.iter().map(|(name, p)| PoolInfo { name: name.clone(), osts: p.osts.clone() }).collect();
        ClusterConfig {
            fsname: self.cfg.fsname.clone(),
            generation: st.generation,
            mdts,
            osts,
            pools,
            root_squash: self.cfg.root_squash.clone(),
        }
    }
}

impl Service for Mgs {
    async fn handle(&self, _ctx: RequestCtx, req: Request, _payload: Bytes) -> Answer {
        let resp = match req {
            Request::Ping => Response::Ok,
            Request::MgsRegister { kind, uuid, index, address, fsname, epoch } => {
                self.register(kind, uuid, index, address, fsname, epoch)
            }
            Request::MgsHeartbeat { kind, index, uuid, usage, media } => {
                self.heartbeat(kind, index, &uuid, usage, media)
            }
            Request::MgsGetConfig => Response::Config(self.config()),
            Request::MgsPool { fsname, pool, op, osts } => self.pool(&fsname, &pool, op, &osts),
            other => Response::error(Errno::Proto, format!("the MGS does not serve {}", other.op_name())),
        };
        (resp, vec![])
    }
}

/// Starts serving on `listener`.
pub async fn serve(mgs: Arc<Mgs>, listener: tokio::net::TcpListener, server: rpc::server::ServerConfig) {
    rpc::server::serve(listener, Arc::new(server), mgs).await
}
