//! Raft messages between the replicas of one MDT, over braid's own RPC.
//!
//! Every message is a [`Request::MdtRaft`] whose payload is the openraft message in
//! postcard; the answer's payload is `Result<answer, String>` the same way. The RPC
//! layer authenticates the sender with the cluster secret (and TLS where set up);
//! the request names the file system and the replica group, and a replica of
//! another group is refused with a message that says so. A message that does not
//! decode is refused too, and the group goes on.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::error::{InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use proto::msg::{RaftRpc, Request, Response};
use rpc::client::{Identity, RpcClient, RpcOptions};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{BasicNode, NodeId, Raft, TypeConfig};

/// Frames carry at most 16 MiB of payload; appends are cut below that.
const MESSAGE_MAX: usize = 15 << 20;

/// Who this group is, as its messages say.
#[derive(Clone)]
pub struct GroupName {
    pub fsname: String,
    /// Names the group: the MDT's replica addresses, in order.
    pub group: String,
}

pub struct Network {
    pub identity: Arc<Identity>,
    pub name: GroupName,
}

pub struct Peer {
    client: RpcClient,
    name: GroupName,
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let opts = RpcOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            recovery_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        Peer { client: RpcClient::new(node.addr.clone(), self.identity.clone(), opts), name: self.name.clone(), target }
    }
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

fn network<E: std::error::Error>(e: impl std::fmt::Display) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(e.to_string())))
}

impl Peer {
    async fn send<Q: Serialize, A: DeserializeOwned, E: std::error::Error>(
        &self,
        kind: RaftRpc,
        msg: &Q,
        ttl: Duration,
    ) -> Result<A, RPCError<NodeId, BasicNode, E>> {
        let body = postcard::to_allocvec(msg).map_err(network)?;
        let req = Request::MdtRaft { fsname: self.name.fsname.clone(), group: self.name.group.clone(), kind };
        let reply = match tokio::time::timeout(ttl, self.client.call(&req, vec![Bytes::from(body)])).await {
            Err(_) => return Err(network(format!("replica {} did not answer within {ttl:?}", self.target))),
            Ok(Err(e)) if e.is_retryable() => {
                return Err(RPCError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string()))))
            }
            Ok(Err(e)) => return Err(network(e)),
            Ok(Ok(r)) => r,
        };
        match reply.response {
            Response::Data => {}
            Response::Error(e) => return Err(network(format!("replica {} refused: {e}", self.target))),
            other => return Err(network(format!("replica {} answered {other:?}", self.target))),
        }
        let answer: Result<A, String> = postcard::from_bytes(&reply.payload).map_err(network)?;
        answer.map_err(|e| network(format!("replica {}: {e}", self.target)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let n = rpc.entries.len() as u64;
        let size: usize = rpc.entries.iter().map(super::entry_size).sum();
        if size > MESSAGE_MAX && n > 1 {
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(n / 2)));
        }
        self.send(RaftRpc::AppendEntries, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.send(RaftRpc::InstallSnapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> Result<VoteResponse<NodeId>, RpcErr> {
        self.send(RaftRpc::Vote, &rpc, option.hard_ttl()).await
    }
}

fn answer<A: Serialize, E: std::fmt::Display>(r: Result<A, E>) -> Bytes {
    let r = r.map_err(|e| e.to_string());
    Bytes::from(postcard::to_allocvec(&r).expect("an answer encodes"))
}

fn decode<T: DeserializeOwned>(kind: RaftRpc, payload: &[u8]) -> Result<T, String> {
    postcard::from_bytes(payload).map_err(|e| format!("a Raft {kind:?} message that does not decode: {e}"))
}

/// Hands a message from another replica to this one's Raft; `Err` says why it was
/// refused.
pub async fn handle(raft: &Raft, kind: RaftRpc, payload: &[u8]) -> Result<Bytes, String> {
    Ok(match kind {
        RaftRpc::Vote => answer(raft.vote(decode(kind, payload)?).await),
        RaftRpc::AppendEntries => answer(raft.append_entries(decode(kind, payload)?).await),
        RaftRpc::InstallSnapshot => answer(raft.install_snapshot(decode(kind, payload)?).await),
    })
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};

    use super::*;
    use crate::replica::{Entry, MdtEntry};

    /// A valid append of two entries, encoded.
    fn append() -> Vec<u8> {
        let log_id = |i| LogId::new(CommittedLeaderId::new(3, 1), i);
        let entry = |i| Entry {
            log_id: log_id(i),
            payload: EntryPayload::Normal(MdtEntry { origin: 9, format: 1, redo: vec![i as u8; 40] }),
        };
        let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(4)),
            entries: vec![entry(5), entry(6)],
            leader_commit: Some(log_id(4)),
        };
        postcard::to_allocvec(&req).unwrap()
    }

    /// Hostile and damaged messages (random bytes; a valid message cut short or
    /// with bytes changed): every one decodes or is refused, none panics.
    #[test]
    fn damaged_and_random_messages_are_refused_without_a_panic() {
        let valid = append();
        let back: AppendEntriesRequest<TypeConfig> = decode(RaftRpc::AppendEntries, &valid).unwrap();
        assert_eq!(back.entries.len(), 2);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let try_all = |b: &[u8]| {
            let _ = decode::<AppendEntriesRequest<TypeConfig>>(RaftRpc::AppendEntries, b);
            let _ = decode::<VoteRequest<NodeId>>(RaftRpc::Vote, b);
            let _ = decode::<InstallSnapshotRequest<TypeConfig>>(RaftRpc::InstallSnapshot, b);
        };
        for len in 0..valid.len() {
            try_all(&valid[..len]);
            assert!(decode::<AppendEntriesRequest<TypeConfig>>(RaftRpc::AppendEntries, &valid[..len]).is_err());
        }
        for _ in 0..20_000 {
            let mut b = valid.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            try_all(&b);
            let random: Vec<u8> = (0..next() % 200).map(|_| next() as u8).collect();
            try_all(&random);
        }
    }
}
