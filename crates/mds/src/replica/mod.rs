//! A replicated MDT: one MDT served by a group of MDS processes (3 or 5) that
//! agree on its changes through Raft ([`openraft`]), so that it survives the loss
//! of a minority of them.
//!
//! Each group-commit batch's record (the [`RedoBatch`] the local journal would
//! hold) is one Raft entry, proposed by the leader's committer: the batch is
//! answered once a majority holds it (see [`crate::journal::Journal::committed`]).
//! The reply cache is in the same batches, so a retried change is answered as the
//! first time on whichever replica leads next. Followers apply the entries to their
//! database ([`sm`]); the leader has them in its memtable already and checkpoints
//! them with the applied log id. A replica that was away catches up from the log
//! ([`log`]) or, once the log was purged, from a snapshot of the database.
//!
//! Serving: a replica answers Raft messages at once, and holds clients' requests
//! until it leads. On becoming leader it waits until it has applied everything
//! committed, formats the MDT if the group never did (as one entry, so that every
//! replica holds the same root), opens it as a restarted MDS would (a recovery
//! window in which clients replay opens and locks), registers with the MGS under
//! its term (a deposed leader's registration is refused) and serves. A leader that
//! loses its term restarts its process in place (exec, Ceph's MDS "respawn"): its
//! memory may hold changes the group never committed, and the new process starts
//! from what the group did.
//!
//! Bootstrap: replica 0 of a group none of whose replicas has a log initializes the
//! group. The group's identity is derived from its replica list; a data directory
//! of another group is refused at start.

pub mod log;
pub mod net;
pub mod sm;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use openraft::{Config, ServerState, SnapshotPolicy};
use proto::msg::{Request, Response, TargetKind};
use proto::Errno;
use rpc::server::{Answer, Callbacks, RequestCtx, Service};
use rpc::{Identity, RpcClient};
use serde::{Deserialize, Serialize};
use store::{Store, StoreError};
use tokio::sync::watch;

use crate::cluster::ClusterView;
use crate::journal::Journal;
use crate::mdt::schema::{Redo, RedoBatch, Tbl, FORMAT};
use crate::target::Mdt;
use crate::{MdsConfig, MdsError};

pub use openraft::BasicNode;
pub type NodeId = u64;

/// One Raft entry: a group-commit batch's changes.
#[derive(Clone, Serialize, Deserialize)]
pub struct MdtEntry {
    /// The leader process that proposed it (its memtable holds the changes); 0 for
    /// an entry every replica applies to its database (the MDT's format).
    pub origin: u64,
    /// The database format its record is written in.
    pub format: u64,
    #[serde(with = "proto::bytes_field")]
    pub redo: Vec<u8>,
}

impl std::fmt::Debug for MdtEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MdtEntry {{ origin: {:x}, {} bytes }}", self.origin, self.redo.len())
    }
}

impl std::fmt::Display for MdtEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

openraft::declare_raft_types!(
    /// The Raft types of a replicated MDT.
    pub TypeConfig: D = MdtEntry, R = ()
);

pub type Entry = openraft::Entry<TypeConfig>;
pub type Raft = openraft::Raft<TypeConfig>;

pub(crate) fn entry_size(e: &Entry) -> usize {
    match &e.payload {
        openraft::EntryPayload::Normal(d) => d.redo.len() + 64,
        _ => 256,
    }
}

pub(crate) fn now_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// How long a new leader waits to have applied its whole log before it serves.
const CATCH_UP: Duration = Duration::from_secs(30);

/// `meta` key: the replica group the database belongs to.
const META_GROUP: &[u8] = b"replica_group";

/// How a replica group is set up (`braid mds --replicas`).
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// The MDT's directory on this node (its database and Raft log).
    pub dir: PathBuf,
    /// Every replica's address, this one's included, the same list on each.
    pub replicas: Vec<String>,
    /// This replica's position in `replicas`.
    pub me: usize,
    pub fsname: String,
    /// Raft timing: heartbeats, and how long followers wait before an election.
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    /// A snapshot is built every this many entries; the log keeps a tenth of that
    /// behind it (a replica away longer catches up from the snapshot).
    pub snapshot_entries: u64,
}

impl ReplicaConfig {
    /// The group's identity: the same on every replica given the same list.
    pub fn group(&self) -> String {
        let list = self.replicas.join(",");
        let rev: String = list.chars().rev().collect();
        format!("mdt-replicas-{:08x}{:08x}", crc32c::crc32c(list.as_bytes()), crc32c::crc32c(rev.as_bytes()))
    }

    /// Checks the list: 1 to 7 distinct addresses, this one among them.
    pub fn check(&self) -> Result<(), String> {
        let n = self.replicas.len();
        if n == 0 || n > 7 {
            return Err(format!("a replicated MDT has 1 to 7 replicas (3 or 5 survive failures), not {n}"));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = self.replicas.iter().find(|a| !seen.insert(a.as_str())) {
            return Err(format!("replica {dup} is listed twice"));
        }
        if self.me >= n {
            return Err("this MDS's address is not among the replicas".into());
        }
        Ok(())
    }
}

/// One replica: its Raft node, its database, and (while it leads) the MDS serving
/// the MDT.
pub struct Replica {
    raft: Raft,
    store: Arc<Store>,
    sm: Arc<sm::Shared>,
    name: net::GroupName,
    cfg: ReplicaConfig,
    mds_cfg: MdsConfig,
    identity: Arc<Identity>,
    mgs: Arc<RpcClient>,
    /// The MDS while this replica leads and serves.
    serving: watch::Sender<Option<Arc<crate::Mds>>>,
    callbacks: Arc<Callbacks>,
}

/// Restarts this process in place: a leader that lost its term, whose memory may
/// hold what the group never committed.
fn respawn(why: &str) -> ! {
    use std::os::unix::process::CommandExt;
    tracing::error!("restarting this MDS in place: {why}");
    eprintln!("braid mds: restarting in place: {why}");
    let err = std::process::Command::new("/proc/self/exe").args(std::env::args_os().skip(1)).exec();
    eprintln!("braid mds: cannot restart ({err}); stopping");
    std::process::exit(3);
}

fn store_err(e: impl std::fmt::Display) -> MdsError {
    MdsError::Store(StoreError::engine("replica", e))
}

impl Replica {
    /// Opens the replica in `cfg.dir` and starts its Raft node; it serves clients
    /// once it leads (see the module note). Must run in a multi-threaded runtime.
    pub async fn start(
        cfg: ReplicaConfig,
        mds_cfg: MdsConfig,
        identity: Arc<Identity>,
        mgs: Arc<RpcClient>,
    ) -> Result<Arc<Replica>, MdsError> {
        cfg.check().map_err(store_err)?;
        let group = cfg.group();
        let io = |path: &Path, e: std::io::Error| store_err(format!("{}: {e}", path.display()));
        std::fs::create_dir_all(&cfg.dir).map_err(|e| io(&cfg.dir, e))?;
        let store = Arc::new(Store::open(&cfg.dir.join("mdt.redb"))?);
        let machine = sm::StateMachine::open(store.clone())?;
        check_group(&store, &group, &cfg.dir)?;
        let log = log::LogStore::open(&cfg.dir.join("raft"), mds_cfg.sync_journal)
            .map_err(|e| io(&cfg.dir.join("raft"), e))?;
        let pristine = log.is_pristine() && machine.shared.applied().0.is_none();
        let hb = cfg.heartbeat.as_millis().max(10) as u64;
        let el = cfg.election_timeout.as_millis().max(hb as u128 * 3) as u64;
        let raft_cfg = Config {
            cluster_name: group.clone(),
            heartbeat_interval: hb,
            election_timeout_min: el,
            election_timeout_max: el * 2,
            install_snapshot_timeout: 10_000,
            max_payload_entries: 64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_entries.max(1)),
            max_in_snapshot_log_to_keep: cfg.snapshot_entries / 10,
            ..Default::default()
        }
        .validate()
        .map_err(store_err)?;
        let name = net::GroupName { fsname: cfg.fsname.clone(), group };
        let network = net::Network { identity: identity.clone(), name: name.clone() };
        let sm_shared = machine.shared.clone();
        tokio::spawn(sm::flush(Arc::downgrade(&sm_shared)));
        let me = cfg.me as NodeId;
        let raft = Raft::new(me, Arc::new(raft_cfg), network, log, machine).await.map_err(store_err)?;
        if pristine && cfg.me == 0 {
            let members: BTreeMap<NodeId, BasicNode> =
                cfg.replicas.iter().enumerate().map(|(i, a)| (i as NodeId, BasicNode::new(a))).collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!("replica group of {} initialized", cfg.replicas.len()),
                Err(e) => tracing::info!("replica group not initialized here: {e}"),
            }
        }
        let (serving, _) = watch::channel(None);
        let replica = Arc::new(Replica {
            raft,
            store,
            sm: sm_shared,
            name,
            cfg,
            mds_cfg,
            identity,
            mgs,
            serving,
            callbacks: Arc::default(),
        });
        tokio::spawn(replica.clone().lead());
        Ok(replica)
    }

    /// Waits to lead, then serves the MDT until the term ends (see the module note).
    async fn lead(self: Arc<Self>) {
        // The server metrics change with the vote and the role only: the full
        // metrics change with every entry, and would wake this task for each.
        let mut server = self.raft.server_metrics();
        let stopped = |raft: &Raft| -> ! {
            let why = raft.metrics().borrow().running_state.clone().err();
            let why = why.map_or_else(|| "it stopped".to_string(), |e| e.to_string());
            tracing::error!("the Raft node of this replica stopped: {why}");
            eprintln!("braid mds: the Raft node of this replica stopped: {why}");
            std::process::exit(1);
        };
        let term = loop {
            let (state, term) = {
                let m = server.borrow_and_update();
                (m.state, m.vote.leader_id().get_term())
            };
            if state == ServerState::Leader {
                match self.raft.ensure_linearizable().await {
                    Ok(_) => break term,
                    Err(e) => tracing::info!("elected for term {term} but cannot lead yet: {e}"),
                }
            }
            if server.changed().await.is_err() {
                stopped(&self.raft);
            }
        };
        // A leader restarted within its term leads on without an election, and its
        // log may end in entries its previous process proposed and the group had
        // not committed yet: they commit now, and must be in the database before
        // this process's own batches are computed on it.
        let last = self.raft.metrics().borrow().last_log_index;
        let caught_up = self.raft.wait(Some(CATCH_UP)).applied_index_at_least(last, "the log before serving").await;
        if let Err(e) = caught_up {
            respawn(&format!("elected for term {term}, but its log was not applied within {CATCH_UP:?}: {e}"));
        }
        tracing::info!(term, "leading the replica group");
        let mds = match self.serve(term).await {
            Ok(m) => m,
            Err(e) => {
                // A pause first: an MGS away would otherwise have the group elect
                // and restart leaders in a tight loop.
                tracing::error!(term, "cannot serve the MDT as leader: {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
                respawn(&format!("cannot serve the MDT as leader of term {term}: {e}"))
            }
        };
        self.serving.send_replace(Some(mds));
        loop {
            if server.changed().await.is_err() {
                respawn("the Raft node stopped");
            }
            let (state, now) = {
                let m = server.borrow_and_update();
                (m.state, m.vote.leader_id().get_term())
            };
            if state != ServerState::Leader || now != term {
                respawn(&format!("no longer the leader of term {term} ({state:?} in term {now})"));
            }
        }
    }

    /// Formats the MDT if the group never did, opens it and registers with the MGS.
    async fn serve(&self, term: u64) -> Result<Arc<crate::Mds>, String> {
        // What this replica applied as a follower goes into the database first:
        // the format's checks below and the MDT's open read it there.
        self.sm.checkpoint().map_err(|e| e.to_string())?;
        let group = self.name.group.clone();
        let mut target = rpc::target::TargetDir {
            kind: TargetKind::Mdt,
            dir: self.cfg.dir.clone(),
            uuid: group.clone(),
            index: crate::mdt::schema::stored_index(&self.store).map_err(|e| e.to_string())?,
            epoch: term,
        };
        let index = target.register(&self.mgs, self.address(), &self.name.fsname).await.map_err(|e| e.to_string())?;
        if target.index != Some(index) || crate::mdt::schema::stored_index(&self.store).ok().flatten().is_none() {
            self.format(index).await?;
            self.sm.checkpoint().map_err(|e| e.to_string())?;
        }
        // Random, never 0: tells this process's entries from any other's.
        let origin = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
        };
        self.sm.serving.store(origin, Ordering::Release);
        let (committed, committed_rx) = watch::channel(0);
        let journal = RaftJournal {
            raft: self.raft.clone(),
            origin,
            committed: Arc::new(committed),
            committed_rx,
            pending: None,
            seq: 0,
            len: 0,
            sm: self.sm.clone(),
        };
        let cluster = Arc::new(RwLock::new(ClusterView::default()));
        let mdt = Mdt::open_replicated(
            index,
            &self.cfg.dir,
            self.store.clone(),
            self.sm.mem.clone(),
            Box::new(journal),
            &self.mds_cfg,
            cluster.clone(),
        )
        .map_err(|e| e.to_string())?;
        let mdts = HashMap::from([(index, mdt)]);
        let dirs = HashMap::from([(index, self.cfg.dir.clone())]);
        let mds = crate::Mds::serve_mdts(
            mdts,
            dirs,
            self.mds_cfg.clone(),
            self.identity.clone(),
            self.mgs.clone(),
            cluster,
            self.callbacks.clone(),
        );
        mds.load_config().await.map_err(|e| format!("cannot fetch the configuration from the MGS: {e}"))?;
        let report: rpc::target::TargetReport = Arc::new(|t| (rpc::target::dir_usage(&t.dir), None));
        rpc::target::spawn_heartbeat(
            self.mgs.clone(),
            vec![target],
            self.address().to_string(),
            self.name.fsname.clone(),
            self.mds_cfg.config_refresh,
            report,
        );
        tracing::info!(term, "MDT{index:04x} served by this replica");
        Ok(mds)
    }

    fn address(&self) -> &str {
        &self.cfg.replicas[self.cfg.me]
    }

    /// Formats MDT `index` as one entry every replica applies: the rows a fresh
    /// format writes, made in a scratch database.
    async fn format(&self, index: u32) -> Result<(), String> {
        let scratch = self.cfg.dir.join("format.redb");
        let _ = std::fs::remove_file(&scratch);
        let rows = (|| -> Result<Vec<Redo>, String> {
            let s = Store::open(&scratch).map_err(|e| e.to_string())?;
            crate::mdt::schema::format(&s, index, &self.mds_cfg.default_layout).map_err(|e| e.to_string())?;
            let snap = s.snapshot().map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            for tbl in Tbl::ALL {
                for row in snap.range(tbl.table(), std::ops::Bound::Unbounded).map_err(|e| e.to_string())? {
                    let (k, v) = row.map_err(|e| e.to_string())?;
                    rows.push(Redo::Put(tbl, k, v));
                }
            }
            rows.push(Redo::Put(Tbl::Meta, META_GROUP.to_vec(), self.name.group.as_bytes().to_vec()));
            Ok(rows)
        })();
        let _ = std::fs::remove_file(&scratch);
        let entry = MdtEntry { origin: 0, format: FORMAT, redo: store::encode_record(&RedoBatch(rows?)) };
        self.raft.client_write(entry).await.map_err(|e| format!("cannot format the MDT through the group: {e}"))?;
        tracing::info!("MDT{index:04x} formatted through the replica group");
        Ok(())
    }
}

/// Refuses a database that belongs to another replica group.
fn check_group(store: &Store, group: &str, dir: &Path) -> Result<(), MdsError> {
    let snap = store.snapshot()?;
    let held = snap.get(Tbl::Meta.table(), META_GROUP, |v| Ok::<_, StoreError>(v.to_vec()))?;
    match held {
        Some(g) if g != group.as_bytes() => Err(MdsError::Format {
            index: crate::mdt::schema::stored_index(store).ok().flatten().unwrap_or(u32::MAX),
            dir: dir.to_path_buf(),
            detail: format!(
                "this MDT directory belongs to replica group {}, not to {group} (the group of these --replicas); \
                 give each group its own directories",
                String::from_utf8_lossy(&g)
            ),
        }),
        None if crate::mdt::schema::stored_index(store).ok().flatten().is_some() => Err(MdsError::Format {
            index: u32::MAX,
            dir: dir.to_path_buf(),
            detail: "this directory holds an MDT that is not replicated; a replica group starts from empty \
                     directories"
                .into(),
        }),
        _ => Ok(()),
    }
}

/// The leader's journal: each record is proposed as an entry (see the module note).
struct RaftJournal {
    raft: Raft,
    origin: u64,
    committed: Arc<watch::Sender<u64>>,
    committed_rx: watch::Receiver<u64>,
    /// The last entry proposed, not waited for yet: its sequence and its answer.
    pending: Option<(u64, tokio::sync::oneshot::Receiver<openraft::raft::ClientWriteResult<TypeConfig>>)>,
    /// The last record's sequence number.
    seq: u64,
    /// Bytes proposed since the last checkpoint.
    len: u64,
    sm: Arc<sm::Shared>,
}

impl Journal for RaftJournal {
    fn append(&mut self, seq: u64, record: &[u8]) -> Result<(), StoreError> {
        let entry = MdtEntry { origin: self.origin, format: FORMAT, redo: record.to_vec() };
        // Proposing only queues the entry for the Raft core (no await inside but
        // on a stopped core): poll it once, from this synchronous committer.
        let mut propose = std::pin::pin!(self.raft.client_write_ff(entry));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let rx = match propose.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(rx)) => rx,
            std::task::Poll::Ready(Err(e)) => respawn(&format!("the Raft node stopped: {e}")),
            std::task::Poll::Pending => respawn("the Raft node stopped"),
        };
        self.pending = Some((seq, rx));
        self.seq = seq;
        self.len += record.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        if len == 0 {
            self.len = 0;
        } else if len < self.len {
            // A batch that panicked after proposing: the group may commit it, and
            // this memtable no longer holds it.
            respawn("a batch failed after its entry was proposed");
        }
        Ok(())
    }

    fn committed(&self) -> Option<watch::Receiver<u64>> {
        Some(self.committed_rx.clone())
    }

    fn until_committed(&mut self) -> Option<crate::journal::CommitWait> {
        if let Some((seq, rx)) = self.pending.take() {
            // The batch's own entry: once it is committed, so is every one before.
            let committed = self.committed.clone();
            return Some(Box::pin(async move {
                match rx.await {
                    Ok(Ok(_)) => committed.send_modify(|c| *c = (*c).max(seq)),
                    Ok(Err(e)) => respawn(&format!("a proposed entry was not committed: {e}")),
                    Err(_) => respawn("the Raft node dropped a proposed entry"),
                }
            }));
        }
        // No entry of its own (answers from the reply cache): the earlier ones.
        let (seq, mut committed) = (self.seq, self.committed_rx.clone());
        if *committed.borrow() >= seq {
            return None;
        }
        Some(Box::pin(async move {
            if committed.wait_for(|c| *c >= seq).await.is_err() {
                std::future::pending::<()>().await;
            }
        }))
    }

    fn checkpoint_meta(&self) -> Vec<(&'static [u8], Vec<u8>)> {
        let (applied, membership) = self.sm.applied();
        vec![
            (sm::META_APPLIED, postcard::to_allocvec(&applied).expect("encodes")),
            (sm::META_MEMBERSHIP, postcard::to_allocvec(&membership).expect("encodes")),
        ]
    }
}

impl Service for Replica {
    async fn handle(&self, ctx: RequestCtx, req: Request, payload: Bytes) -> Answer {
        if let Request::MdtRaft { fsname, group, kind } = &req {
            if !ctx.from_server {
                return (Response::error(Errno::Perm, "Raft messages are taken from MDS replicas only"), vec![]);
            }
            if *fsname != self.name.fsname || *group != self.name.group {
                return (
                    Response::error(
                        Errno::Inval,
                        format!(
                            "this replica is of file system '{}', group {}; the message is for '{fsname}', group \
                             {group}",
                            self.name.fsname, self.name.group
                        ),
                    ),
                    vec![],
                );
            }
            return match net::handle(&self.raft, *kind, &payload).await {
                Ok(answer) => (Response::Data, vec![answer]),
                Err(e) => {
                    tracing::warn!(peer = %ctx.peer, "refused a Raft message: {e}");
                    (Response::error(Errno::Proto, e), vec![])
                }
            };
        }
        // Held until this replica leads; a client that waits looks up the leader
        // at the MGS meanwhile and sends its request there.
        let mut serving = self.serving.subscribe();
        let mds = match serving.wait_for(Option::is_some).await {
            Ok(m) => m.clone().expect("serving"),
            Err(_) => return (Response::error(Errno::Io, "this MDS replica is stopping"), vec![]),
        };
        mds.handle(ctx, req, payload).await
    }

    fn client_gone(&self, client_id: u64) {
        if let Some(m) = self.serving.borrow().as_ref() {
            m.client_gone(client_id);
        }
    }

    fn connection_closed(&self, client_id: u64, conn_id: u64) {
        if let Some(m) = self.serving.borrow().as_ref() {
            m.connection_closed(client_id, conn_id);
        }
    }

    fn callbacks(&self) -> Option<&Callbacks> {
        Some(&self.callbacks)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{RaftLogReader, StorageError};

    use super::*;

    /// A replica's directory for one case of the suite, removed after it.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Stores;

    impl StoreBuilder<TypeConfig, log::LogStore, sm::StateMachine, Scratch> for Stores {
        async fn build(&self) -> Result<(Scratch, log::LogStore, sm::StateMachine), StorageError<NodeId>> {
            static CASE: AtomicU32 = AtomicU32::new(0);
            let n = CASE.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("braid-replica-suite-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let store = Arc::new(Store::open(&dir.join("mdt.redb")).unwrap());
            let machine = sm::StateMachine::open(store).unwrap();
            let log = log::LogStore::open(&dir.join("raft"), false).unwrap();
            Ok((Scratch(dir), log, machine))
        }
    }

    /// openraft's own conformance suite for log stores and state machines: votes,
    /// appends, truncation, purges, membership, snapshots built and installed.
    #[test]
    fn the_log_and_state_machine_pass_openraft_s_storage_suite() {
        Suite::test_all(Stores).unwrap();
    }

    #[test]
    fn a_log_reopens_with_its_entries_and_cuts_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("braid-replica-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let entry = |index: u64| Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 0), index),
            payload: openraft::EntryPayload::Normal(MdtEntry { origin: 7, format: FORMAT, redo: vec![index as u8; 9] }),
        };
        rt.block_on(async {
            let mut log = log::LogStore::open(&dir, false).unwrap();
            openraft::storage::RaftLogStorageExt::blocking_append(&mut log, (1..=5).map(entry)).await.unwrap();
        });
        // A crash mid-append: half a record at the end.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(dir.join("log")).unwrap();
            f.write_all(&[40, 0, 0, 0, 1, 2, 3]).unwrap();
        }
        rt.block_on(async {
            let mut log = log::LogStore::open(&dir, false).unwrap();
            let got = log.try_get_log_entries(0..100).await.unwrap();
            assert_eq!(got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
            // Appends after the cut land after the last whole record.
            openraft::storage::RaftLogStorageExt::blocking_append(&mut log, [entry(6)]).await.unwrap();
        });
        rt.block_on(async {
            let mut log = log::LogStore::open(&dir, false).unwrap();
            assert_eq!(log.try_get_log_entries(0..100).await.unwrap().len(), 6);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
