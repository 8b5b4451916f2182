//! Serving a kernel request without holding a FUSE thread while it waits.
//!
//! A FUSE thread that waits for its request's answer serves nothing else meanwhile.
//! Requests can wait for a long time: an F_SETLKW until another process unlocks, an
//! RPC to a server being restarted. With as many such requests as the mount has
//! threads, the mount stopped: the unlock that would have ended the waits was never
//! read, and every process using the mount hung with them.
//!
//! So no request keeps a FUSE thread waiting. [`serve`] runs a request on the thread
//! until it first has to wait (an RPC sent, a lock held elsewhere) and then leaves it
//! parked: whatever it waits for wakes it as a task of the client's runtime, which
//! answers the kernel. A request answered from what the mount holds (cached
//! attributes, a write behind) never leaves the thread, and one that waits costs no
//! more wake-ups than a thread blocked on the runtime did: the reply's own wake-up
//! runs the rest of it, where it used to wake the blocked thread in turn.
//!
//! The kernel bounds how many requests wait at once: synchronous ones by the
//! processes making them, background ones (read-ahead, asynchronous I/O) by the
//! mount's `max_background`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use tokio::runtime::Handle;

type Op = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A request that waits, and where it goes when woken.
struct Parked {
    slot: Mutex<Slot>,
    rt: Handle,
}

enum Slot {
    /// The first poll is under way on the FUSE thread.
    Polling,
    /// Woken during the first poll: the thread spawns it as soon as the poll ends.
    WokenWhilePolling,
    /// Waiting for its first wake-up.
    Parked(Op),
    /// A task of the runtime now (it polls with the task's own waker).
    Spawned,
}

impl Wake for Parked {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut slot = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match std::mem::replace(&mut *slot, Slot::Spawned) {
            Slot::Parked(op) => {
                drop(slot);
                self.rt.spawn(op);
            }
            Slot::Polling | Slot::WokenWhilePolling => *slot = Slot::WokenWhilePolling,
            // A wake-up registered before the task's first poll: that poll saw it.
            Slot::Spawned => {}
        }
    }
}

/// Runs `op` on this thread until it first waits, then as a task of `rt` once woken.
/// `caller` (pid, uid, gid) is the process the I/O tracer charges it to, on every poll.
pub fn serve(rt: &Handle, caller: (u32, u32, u32), op: impl Future<Output = ()> + Send + 'static) {
    let mut inner = Box::pin(op);
    let (pid, uid, gid) = caller;
    let mut op: Op = Box::pin(std::future::poll_fn(move |cx| {
        client::tracer::with_caller(pid, uid, gid, || inner.as_mut().poll(cx))
    }));
    let parked = Arc::new(Parked { slot: Mutex::new(Slot::Polling), rt: rt.clone() });
    let waker = Waker::from(parked.clone());
    let _runtime = rt.enter();
    if op.as_mut().poll(&mut Context::from_waker(&waker)).is_ready() {
        return;
    }
    let mut slot = parked.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if matches!(*slot, Slot::WokenWhilePolling) {
        *slot = Slot::Spawned;
        drop(slot);
        rt.spawn(op);
    } else {
        *slot = Slot::Parked(op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn a_ready_request_runs_on_the_calling_thread_and_a_waiting_one_finishes_on_the_runtime() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let here = std::thread::current().id();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = tx.clone();
        serve(rt.handle(), (1, 0, 0), async move { t.send(std::thread::current().id()).unwrap() });
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), here, "a ready request stays on its thread");

        let (go, wait) = tokio::sync::oneshot::channel::<u32>();
        serve(rt.handle(), (1, 0, 0), async move {
            let v = wait.await.unwrap();
            tx.send(std::thread::current().id()).unwrap();
            assert_eq!(v, 7);
        });
        assert!(rx.try_recv().is_err(), "a waiting request must not have finished");
        go.send(7).unwrap();
        let there = rx.recv_timeout(Duration::from_secs(5)).expect("the woken request finishes");
        assert_ne!(there, here, "the woken request runs on the runtime");
    }

    #[test]
    fn a_request_woken_during_its_first_poll_is_not_lost() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // yield_now wakes its own waker before returning Pending: the wake-up comes
        // while the serving thread is still polling.
        serve(rt.handle(), (1, 0, 0), async move {
            tokio::task::yield_now().await;
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("the request woken during its first poll finishes");
    }

    #[test]
    fn many_requests_woken_in_any_order_each_finish_once() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let mut senders = Vec::new();
        for i in 0..200u64 {
            let (go, wait) = tokio::sync::oneshot::channel::<()>();
            senders.push(go);
            let done = done.clone();
            serve(rt.handle(), (1, 0, 0), async move {
                // Some wait twice: once parked, once as a task.
                wait.await.unwrap();
                if i % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        // Woken from another thread, in reverse order.
        let wakers = std::thread::spawn(move || {
            for go in senders.into_iter().rev() {
                go.send(()).unwrap();
            }
        });
        wakers.join().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < 200 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(done.load(Ordering::SeqCst), 200);
    }
}
