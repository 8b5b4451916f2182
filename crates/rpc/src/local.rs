//! In-process delivery of requests: Lustre's `0@lo`.
//!
//! `braid local` runs the MGS, the MDS, the OSS and the mount's client in one process.
//! Over TCP each request there would still cost a loopback socket round trip and three
//! or four thread wake-ups (the server's reader task, its handler task, the client's
//! reader task, the waiting caller), which on a small machine is most of what a
//! metadata operation costs. A server registered here under the address it advertises
//! is instead called directly, on the caller's own task, by every [`RpcClient`] of the
//! same process created for that address.
//!
//! Everything above the socket stays the same: the same handler code, the request id
//! (so the MDS reply cache still recognises a retried operation), the per-try deadline,
//! the retries of `Again` and across failures, and a panicking handler answered with
//! an error. Clients in other processes still reach the same servers over TCP.
//!
//! Callbacks (a server asking a client to give up a lease) reach a client of the
//! same process directly too: each client registers its handler here under its
//! client id, and [`crate::server::Callbacks`] calls it before looking for a
//! connection.
//!
//! One difference: a caller that gives up at its deadline drops the handler at its
//! next await point, where over TCP the server would finish it unseen. Handlers must
//! allow that, as the MDS and OSS do (see `docs/design.md`, "Wire protocol").
//!
//! [`RpcClient`]: crate::client::RpcClient

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::{Bytes, BytesMut};

use proto::msg::Request;

use crate::service::{Answer, CallbackHandler, RequestCtx};

/// A service behind a pointer: what an in-process caller invokes (every
/// [`crate::server::Service`] is one).
pub trait Dispatch: Send + Sync {
    fn dispatch(
        &self,
        ctx: RequestCtx,
        req: Request,
        payload: Bytes,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + '_>>;
}

/// Most servers one process registers (`braid local` runs three roles).
const MAX_REGISTERED: usize = 64;

fn registry() -> &'static Mutex<HashMap<String, Arc<dyn Dispatch>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<dyn Dispatch>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Makes `svc` reachable in-process at `addr`, the address it advertises. Clients
/// created afterwards in this process for `addr` call it directly.
pub fn register(addr: &str, svc: Arc<dyn Dispatch>) -> Result<(), String> {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    if r.len() >= MAX_REGISTERED && !r.contains_key(addr) {
        return Err(format!("cannot serve {addr} in-process: {MAX_REGISTERED} servers are registered already"));
    }
    r.insert(addr.to_string(), svc);
    Ok(())
}

/// The in-process server at `addr`, if this process runs one.
pub(crate) fn find(addr: &str) -> Option<Arc<dyn Dispatch>> {
    registry().lock().unwrap_or_else(|p| p.into_inner()).get(addr).cloned()
}

/// Most clients of this process whose callback handlers are remembered.
const MAX_CLIENTS: usize = 1024;

fn clients() -> &'static Mutex<HashMap<u64, Weak<dyn CallbackHandler>>> {
    static CLIENTS: OnceLock<Mutex<HashMap<u64, Weak<dyn CallbackHandler>>>> = OnceLock::new();
    CLIENTS.get_or_init(Default::default)
}

/// Makes `handler` the one callbacks to client `client_id` reach in-process (it is
/// forgotten when dropped). False when too many clients are registered: that client
/// must then not rely on anything a callback would revoke.
pub(crate) fn register_client(client_id: u64, handler: Weak<dyn CallbackHandler>) -> bool {
    let mut c = clients().lock().unwrap_or_else(|p| p.into_inner());
    if c.len() >= MAX_CLIENTS {
        c.retain(|_, h| h.strong_count() > 0);
    }
    if c.len() >= MAX_CLIENTS && !c.contains_key(&client_id) {
        return false;
    }
    c.insert(client_id, handler);
    true
}

/// The callback handler of client `client_id`, if it lives in this process.
pub(crate) fn client_handler(client_id: u64) -> Option<Arc<dyn CallbackHandler>> {
    clients().lock().unwrap_or_else(|p| p.into_inner()).get(&client_id).and_then(Weak::upgrade)
}

/// One payload from the pieces a caller or handler hands over; pieces are copied
/// only when there is more than one.
pub(crate) fn joined(mut parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => {
            let mut b = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for p in &parts {
                b.extend_from_slice(p);
            }
            b.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;
    use proto::auth::Secret;
    use proto::msg::Response;
    use proto::{Errno, RpcError};

    use crate::client::{Identity, RpcClient, RpcOptions};
    use crate::server::Service;

    /// Answers `Ping` after `busy` tries with `Again`, echoes a write's payload back,
    /// panics on `Statfs`-like requests it does not know, and sleeps on a read.
    #[derive(Default)]
    struct Toy {
        calls: AtomicU64,
        busy: u64,
        last_xid: AtomicU64,
        last_client: AtomicU64,
    }

    impl Service for Toy {
        async fn handle(&self, ctx: RequestCtx, req: Request, payload: Bytes) -> Answer {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            self.last_xid.store(ctx.xid, Ordering::SeqCst);
            self.last_client.store(ctx.client_id, Ordering::SeqCst);
            match req {
                Request::Ping if n <= self.busy => (Response::error(Errno::Again, "busy"), vec![]),
                Request::Ping => (Response::Ok, vec![]),
                Request::OstWrite { .. } => {
                    let (a, b) = payload.split_at(payload.len() / 2);
                    (
                        Response::Written { bytes: payload.len() as u64 },
                        vec![Bytes::copy_from_slice(b), Bytes::copy_from_slice(a)],
                    )
                }
                Request::OstRead { .. } => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    (Response::Ok, vec![])
                }
                other => panic!("the toy server does not know {}", other.op_name()),
            }
        }
    }

    fn client(addr: &str, opts: RpcOptions) -> (RpcClient, u64) {
        let id = Identity::new("test", Secret::Insecure);
        let client_id = id.client_id;
        (RpcClient::new(addr, id, opts), client_id)
    }

    fn object() -> proto::ObjectId {
        proto::ObjectId { fid: proto::Fid::new(0, 0x400, 7), component: 0, stripe: 0 }
    }

    #[tokio::test]
    async fn a_registered_server_is_called_without_a_socket_and_keeps_retry_semantics() {
        // Nothing listens at this address: only in-process delivery can answer.
        let addr = "in-process-test.invalid:1";
        let toy = Arc::new(Toy { busy: 2, ..Default::default() });
        register(addr, toy.clone()).expect("register");
        let (c, client_id) = client(addr, RpcOptions::default());
        assert!(c.is_in_process());

        // `Again` is retried with the same request id, as over TCP.
        c.call_with_xid(77, &Request::Ping, vec![]).await.expect("ping after two busy answers");
        assert_eq!(toy.calls.load(Ordering::SeqCst), 3);
        assert_eq!(toy.last_xid.load(Ordering::SeqCst), 77);
        assert_eq!(toy.last_client.load(Ordering::SeqCst), client_id);

        // Payload pieces arrive as one, and the answer's pieces come back joined.
        let req = Request::OstWrite { ost: 0, object: object(), offset: 0, sync: false };
        let pieces = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"def")];
        let reply = c.call(&req, pieces).await.expect("write");
        assert_eq!(reply.response, Response::Written { bytes: 6 });
        assert_eq!(&reply.payload[..], b"defabc");

        // A handler that panics is an error answer, not a dead caller.
        match c.call(&Request::MdsStatfs { mdt: 0 }, vec![]).await {
            Err(RpcError::Remote(e)) => {
                assert_eq!(e.code, Errno::Io);
                assert!(e.message.contains("internal server error"), "{e:?}");
            }
            other => panic!("expected an internal error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_hung_in_process_handler_times_out_like_a_hung_peer() {
        let addr = "in-process-test.invalid:2";
        register(addr, Arc::new(Toy::default())).expect("register");
        let opts = RpcOptions {
            request_timeout: Duration::from_millis(50),
            recovery_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let (c, _) = client(addr, opts);
        let req = Request::OstRead { ost: 0, object: object(), offset: 0, len: 1 };
        match c.call(&req, vec![]).await {
            Err(RpcError::Unavailable { .. }) => {}
            other => panic!("expected Unavailable after the recovery timeout, got {other:?}"),
        }
    }

    #[test]
    fn an_unregistered_address_goes_over_tcp() {
        let (c, _) = client("127.0.0.1:9", RpcOptions::default());
        assert!(!c.is_in_process());
    }

    #[test]
    fn pieces_join_in_order_and_a_single_piece_is_not_copied() {
        let one = Bytes::from_static(b"abc");
        let j = joined(vec![one.clone()]);
        assert_eq!(j.as_ptr(), one.as_ptr());
        assert_eq!(&joined(vec![Bytes::from_static(b"ab"), Bytes::new(), Bytes::from_static(b"cd")])[..], b"abcd");
        assert!(joined(vec![]).is_empty());
    }
}
