//! After a restart: what the clients of the previous run may still owe an MDT.
//!
//! Directory leases are not stored (see [`crate::lease`]). A client that held one
//! when the MDS died may have answered creates and unlinks in the directory itself
//! and returned closes whose flushes it deferred (the client's `deferred`): that
//! work reaches the MDT only once the client has reconnected, sent again by it. Until
//! it has landed, another client that reads the directory would miss files whose
//! close returned, or find them without their bytes; one that changes it could meet
//! names it does not expect. So, after a restart (Lustre's recovery window, with the
//! client's deferred work as its replay):
//!
//! - for [`CALLBACK_TIMEOUT`] (the window), while clients reconnect, reads and
//!   changes of directory entries wait, except the changes only a lease holder makes
//!   (`MdsCreateGranted`, `MdsUnlinkAt`): those are the holders' replay, and go ahead;
//! - then every client connected is called ([`Callback::Recovered`]) and acks once
//!   what it deferred has landed, as it acks a revocation. A request waits for the
//!   acks of every client but its sender (whose deferred work waits for its own
//!   requests, not the other way round), each for at most [`CALLBACK_TIMEOUT`]: a
//!   client that does not answer is not evicted for it, only no longer waited for.
//!
//! Byte-range locks, which live in memory, are replayed the same way: a client that
//! reconnects asks again for the locks it held (`MdsSetLock { reclaim }`), granted at
//! once, and acks the call once that is done; other lock requests wait as reads and
//! changes of entries do.
//!
//! Opens are replayed with them (`MdsReclaimOpen`), and orphans (files unlinked while
//! open) are not destroyed before the recovery is over: a handle open across the
//! restart keeps its file.
//!
//! A client that reconnects after the window's end is not waited for, and what it
//! then sends under a lease of the previous run is refused (`crate::lease`'s
//! `answered_under`), as after an eviction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proto::msg::Callback;
use rpc::server::{Callbacks, RequestCtx, CALLBACK_TIMEOUT};
use tokio::sync::{watch, OnceCell};

/// The recovery of one MDT after a restart.
pub(crate) struct Recovery {
    mdt: u32,
    /// The end of the window.
    until: tokio::time::Instant,
    /// Each client called at the window's end, and whether it acked (or gave up).
    acks: OnceCell<Vec<(u64, watch::Receiver<bool>)>>,
    /// Every client called has acked or was given up on: nothing is waited for.
    over: AtomicBool,
}

impl Recovery {
    /// The recovery of an MDT opened now; `None` for one just formatted, which no
    /// client knew before.
    pub(crate) fn starting(mdt: u32, fresh: bool) -> Option<Recovery> {
        (!fresh).then(|| Recovery {
            mdt,
            until: tokio::time::Instant::now() + CALLBACK_TIMEOUT,
            acks: OnceCell::new(),
            over: AtomicBool::new(false),
        })
    }

    /// Whether a change `client` made under a lease of the previous run is still its
    /// replay: until the window's end, and after it while the recovery waits for that
    /// client's ack (nobody else has looked yet, or the client is among those called
    /// and has not acked). A client that came back later is refused: others may
    /// have read the directories without its change by then.
    pub(crate) fn admits_replay(&self, client: u64) -> bool {
        if tokio::time::Instant::now() < self.until {
            return true;
        }
        match self.acks.get() {
            None => true,
            Some(acks) => acks.iter().any(|(c, ack)| *c == client && !*ack.borrow()),
        }
    }

    /// Waits until the request `ctx` may read or change directory entries: the window
    /// is over, and every other client connected at its end acked.
    pub(crate) async fn wait(&self, ctx: &RequestCtx, callbacks: &Arc<Callbacks>) {
        self.wait_except(Some(ctx.client_id), callbacks).await
    }

    /// Waits until the recovery is over: the window, and every client connected at
    /// its end acked (what the orphan reaper waits for: the clients' replayed opens).
    pub(crate) async fn wait_all(&self, callbacks: &Arc<Callbacks>) {
        self.wait_except(None, callbacks).await
    }

    async fn wait_except(&self, except: Option<u64>, callbacks: &Arc<Callbacks>) {
        if self.over.load(Ordering::Acquire) {
            return;
        }
        tokio::time::sleep_until(self.until).await;
        let acks = self.acks.get_or_init(|| async { call_all(self.mdt, callbacks) }).await;
        for (client, ack) in acks {
            if Some(*client) != except {
                let _ = ack.clone().wait_for(|acked| *acked).await;
            }
        }
        if acks.iter().all(|(_, ack)| *ack.borrow()) {
            self.over.store(true, Ordering::Release);
        }
    }
}

/// Calls every client connected now, each on a task of its own (so no caller that
/// gives up cancels it); each one's receiver turns true when it acked, failed or
/// timed out.
fn call_all(mdt: u32, callbacks: &Arc<Callbacks>) -> Vec<(u64, watch::Receiver<bool>)> {
    let clients = callbacks.clients();
    tracing::info!(mdt, clients = clients.len(), "recovery window over: waiting for what clients deferred");
    clients
        .into_iter()
        .map(|(client, conn)| {
            let (tx, rx) = watch::channel(false);
            let callbacks = callbacks.clone();
            tokio::spawn(async move {
                if let Err(e) = callbacks.call(client, conn, &Callback::Recovered).await {
                    tracing::warn!(mdt, client, "not waiting for a client's deferred work after a restart: {e}");
                }
                let _ = tx.send(true);
            });
            (client, rx)
        })
        .collect()
}
