//! A relay's way to answer requests: forward them to the central store, folding identical waits into one.
//!
//! The event loop of a [`StoreRelay`](super::StoreRelay) hands each request of a local rank to [`Upstream`]
//! instead of a table. Requests that do not wait go to a couple of worker threads sharing one upstream client
//! (whose pool holds a connection per concurrent call, so a few). A `get` or `wait` joins an upstream call
//! already in flight for the same keys, or starts one on a thread of its own (a waiting call must never hold up
//! the sets that would release it). Answers come back through a channel and the loop's waker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use mio::Waker;

use super::connection::later;
use super::table::Waiter;
use super::{ClientOptions, TcpStore};
use crate::frame::Frame;
use crate::frame::frame_name;
use crate::{Key, Store, StoreError};

/// Makes a relay's forwarding half, given the waker of the event loop it will answer through.
pub(super) type StartUpstream =
    Box<dyn FnOnce(Arc<mio::Waker>) -> std::io::Result<Upstream> + Send>;

/// Threads forwarding requests that do not wait.
const OP_WORKERS: usize = 2;
/// How often an idle worker looks at the stop flag.
const WORKER_TICK: Duration = Duration::from_millis(200);
/// How long past its own timeout a local wait is kept for the upstream answer, which names the missing keys.
pub(super) const UPSTREAM_GRACE: Duration = Duration::from_secs(5);

/// Counts of what a relay forwarded, shared with its handle.
#[derive(Debug, Default)]
pub(super) struct RelayCounts {
    /// Requests from local ranks.
    pub requests: AtomicU64,
    /// Calls made to the central store.
    pub upstream_calls: AtomicU64,
}

/// The relay's client of the central store, connected on first use: a relay may start before the store is up
/// (its node's ranks would wait for it anyway), and the first call keeps retrying until the client's connect
/// deadline like any rank would.
pub(super) struct Central {
    addr: String,
    options: ClientOptions,
    client: Mutex<Option<Arc<TcpStore>>>,
}

impl Central {
    /// A client of the store at `addr`, not connected yet.
    pub fn new(addr: String, options: ClientOptions) -> Central {
        Central {
            addr,
            options,
            client: Mutex::new(None),
        }
    }

    /// The connected client, connecting first if no call has yet.
    fn client(&self) -> Result<Arc<TcpStore>, StoreError> {
        // Held while connecting, so concurrent first calls wait for one connection rather than race; connecting
        // ends at the client's connect deadline. A poisoned lock still holds a usable `Option`.
        let mut client = self
            .client
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = client.as_ref() {
            return Ok(Arc::clone(client));
        }
        let connected = Arc::new(TcpStore::connect(self.addr.as_str(), self.options.clone())?);
        *client = Some(Arc::clone(&connected));
        Ok(connected)
    }
}

/// A request handed upstream: how long it may wait, and how long the loop keeps it before giving up on the
/// upstream answer (the wait, the upstream client's I/O timeout and a grace period).
#[derive(Debug, Clone, Copy)]
pub(super) struct Forwarded {
    pub timeout: Duration,
    pub keep: Duration,
}

/// Which waits can share one upstream call: the same operation on the same keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WaitKey {
    Get(Key),
    Wait(Vec<Key>),
}

/// One upstream wait and the local requests sharing it.
#[derive(Debug)]
struct Inflight {
    call: u64,
    /// Each local request with its own deadline (its timeout, without the grace).
    waiters: Vec<(Waiter, Instant, Duration)>,
    /// When the upstream call's own timeout ends.
    until: Instant,
}

/// An answer from a worker.
enum Done {
    Op(Waiter, Frame),
    Wait(WaitKey, u64, Frame),
}

/// The forwarding half of a relay, owned by its event loop.
pub(super) struct Upstream {
    store: Arc<Central>,
    node: usize,
    /// How long one upstream call may take beyond the wait it asks for.
    io_timeout: Duration,
    waker: Arc<Waker>,
    counts: Arc<RelayCounts>,
    stopping: Arc<AtomicBool>,
    ops: Sender<(Waiter, Frame)>,
    done_tx: Sender<Done>,
    done: Receiver<Done>,
    inflight: HashMap<WaitKey, Inflight>,
    next_call: u64,
}

impl Upstream {
    /// Starts the workers that forward to `store` for the relay of `node`.
    pub fn start(
        store: Central,
        io_timeout: Duration,
        node: usize,
        waker: Arc<Waker>,
        counts: Arc<RelayCounts>,
    ) -> std::io::Result<Upstream> {
        let store = Arc::new(store);
        let stopping = Arc::new(AtomicBool::new(false));
        let (ops, jobs) = mpsc::channel::<(Waiter, Frame)>();
        let jobs = Arc::new(Mutex::new(jobs));
        let (done_tx, done) = mpsc::channel();
        for i in 0..OP_WORKERS {
            let (store, jobs, done_tx) = (Arc::clone(&store), Arc::clone(&jobs), done_tx.clone());
            let (waker, stopping, counts) = (
                Arc::clone(&waker),
                Arc::clone(&stopping),
                Arc::clone(&counts),
            );
            thread::Builder::new()
                .name(format!("relay-{node}-op-{i}"))
                .spawn(move || {
                    while !stopping.load(Ordering::SeqCst) {
                        // The lock is held only to take one job; a poisoned lock still holds a usable receiver.
                        let job = jobs
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .recv_timeout(WORKER_TICK);
                        let (waiter, request) = match job {
                            Ok(job) => job,
                            Err(mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        };
                        counts.upstream_calls.fetch_add(1, Ordering::Relaxed);
                        let reply = forward(&store, node, request);
                        if done_tx.send(Done::Op(waiter, reply)).is_err() {
                            return;
                        }
                        let _ = waker.wake();
                    }
                })?;
        }
        Ok(Upstream {
            store,
            node,
            io_timeout,
            waker,
            counts,
            stopping,
            ops,
            done_tx,
            done,
            inflight: HashMap::new(),
            next_call: 0,
        })
    }

    /// Takes one request of a local rank. Returns the reply when it is known at once (a frame that is not a
    /// request, or workers that are gone); otherwise the reply arrives later through [`Upstream::finished`], and
    /// the result says how long the request may wait and how long the loop keeps it before answering it itself.
    pub fn submit(
        &mut self,
        waiter: Waiter,
        request: Frame,
        max_wait: Duration,
        now: Instant,
    ) -> Result<Forwarded, Frame> {
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
        let (key, timeout) = match request {
            Frame::Get { key, timeout } => (WaitKey::Get(key), timeout.min(max_wait)),
            Frame::Wait { keys, timeout } => (WaitKey::Wait(keys), timeout.min(max_wait)),
            Frame::Set { .. }
            | Frame::TryGet { .. }
            | Frame::Add { .. }
            | Frame::CompareSet { .. }
            | Frame::Delete { .. }
            | Frame::NumKeys => {
                return match self.ops.send((waiter, request)) {
                    Ok(()) => Ok(self.forwarded(Duration::ZERO)),
                    Err(_) => Err(self.failed("its forwarding threads are gone".into())),
                };
            }
            other => {
                return Err(Frame::Failed {
                    message: format!("{} is not a request", frame_name(&other)),
                });
            }
        };
        let deadline = later(now, timeout);
        if let Some(inflight) = self.inflight.get_mut(&key) {
            inflight.waiters.push((waiter, deadline, timeout));
            return Ok(self.forwarded(timeout));
        }
        let call = self.next_call;
        self.next_call += 1;
        self.call(key.clone(), call, timeout);
        self.inflight.insert(
            key,
            Inflight {
                call,
                waiters: vec![(waiter, deadline, timeout)],
                until: deadline,
            },
        );
        Ok(self.forwarded(timeout))
    }

    fn forwarded(&self, timeout: Duration) -> Forwarded {
        Forwarded {
            timeout,
            keep: timeout
                .saturating_add(self.io_timeout)
                .saturating_add(UPSTREAM_GRACE),
        }
    }

    /// Starts one upstream wait on a thread of its own.
    fn call(&self, key: WaitKey, call: u64, timeout: Duration) {
        let (store, done_tx, waker) = (
            Arc::clone(&self.store),
            self.done_tx.clone(),
            Arc::clone(&self.waker),
        );
        let node = self.node;
        self.counts.upstream_calls.fetch_add(1, Ordering::Relaxed);
        let own_key = key.clone();
        let spawned = thread::Builder::new()
            .name(format!("relay-{node}-wait"))
            .spawn(move || {
                let reply = match &key {
                    WaitKey::Get(k) => store
                        .client()
                        .and_then(|store| store.get(k, timeout))
                        .map(|v| Frame::Value(Some(v)))
                        .unwrap_or_else(|e| error_reply(&e, node, timeout)),
                    WaitKey::Wait(keys) => store
                        .client()
                        .and_then(|store| store.wait(keys, timeout))
                        .map(|()| Frame::Done)
                        .unwrap_or_else(|e| error_reply(&e, node, timeout)),
                };
                if done_tx.send(Done::Wait(key, call, reply)).is_ok() {
                    let _ = waker.wake();
                }
            });
        if let Err(e) = spawned {
            let reply = self.failed(format!("cannot start a thread to wait upstream: {e}"));
            let _ = self.done_tx.send(Done::Wait(own_key, call, reply));
            let _ = self.waker.wake();
        }
    }

    /// Replies that have come back since the last call: each local request and its answer.
    pub fn finished(&mut self, now: Instant) -> Vec<(Waiter, Frame)> {
        let mut replies = Vec::new();
        while let Ok(done) = self.done.try_recv() {
            match done {
                Done::Op(waiter, reply) => replies.push((waiter, reply)),
                Done::Wait(key, call, reply) => {
                    self.wait_finished(key, call, reply, now, &mut replies)
                }
            }
        }
        replies
    }

    fn wait_finished(
        &mut self,
        key: WaitKey,
        call: u64,
        reply: Frame,
        now: Instant,
        replies: &mut Vec<(Waiter, Frame)>,
    ) {
        // An answer for a call that was given up on (or superseded by a newer one) is ignored.
        if self.inflight.get(&key).is_none_or(|i| i.call != call) {
            return;
        }
        let Some(inflight) = self.inflight.remove(&key) else {
            return;
        };
        if !matches!(reply, Frame::TimedOut { .. }) {
            replies.extend(
                inflight
                    .waiters
                    .into_iter()
                    .map(|(w, ..)| (w, reply.clone())),
            );
            return;
        }
        // The upstream call ran out of time: answer the requests whose own time is up too, and wait again for
        // those that joined later with more time left.
        let (done, left): (Vec<_>, Vec<_>) = inflight
            .waiters
            .into_iter()
            .partition(|(_, deadline, _)| *deadline <= now + Duration::from_millis(1));
        for (waiter, _, timeout) in done {
            let reply = match &reply {
                Frame::TimedOut { missing, .. } => Frame::TimedOut {
                    missing: missing.clone(),
                    after: timeout,
                },
                other => other.clone(),
            };
            replies.push((waiter, reply));
        }
        if let Some(until) = left.iter().map(|(_, deadline, _)| *deadline).max() {
            let call = self.next_call;
            self.next_call += 1;
            self.call(key.clone(), call, until.saturating_duration_since(now));
            self.inflight.insert(
                key,
                Inflight {
                    call,
                    waiters: left,
                    until,
                },
            );
        }
    }

    /// Forgets a local request whose time ran out before the upstream answer came: the reply to send it.
    pub fn expire(&mut self, waiter: Waiter, after: Duration) -> Frame {
        let mut found = None;
        self.inflight.retain(|key, inflight| {
            if let Some(at) = inflight.waiters.iter().position(|(w, ..)| *w == waiter) {
                inflight.waiters.swap_remove(at);
                found = Some(key.clone());
            }
            // An upstream call nobody waits for any more is left to finish; its answer is then ignored.
            !inflight.waiters.is_empty() || inflight.until > Instant::now()
        });
        let missing = match found {
            Some(WaitKey::Get(key)) => vec![key],
            Some(WaitKey::Wait(keys)) => keys,
            None => Vec::new(),
        };
        Frame::TimedOut { missing, after }
    }

    /// Forgets the local request of a connection that closed.
    pub fn forget(&mut self, waiter: Waiter) {
        for inflight in self.inflight.values_mut() {
            inflight.waiters.retain(|(w, ..)| *w != waiter);
        }
    }

    fn failed(&self, why: String) -> Frame {
        Frame::Failed {
            message: format!("the store relay of node {} failed: {why}", self.node),
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Op workers notice within WORKER_TICK; wait threads end when their upstream call does.
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// Makes the upstream call a request stands for and turns its result into the reply frame.
fn forward(central: &Central, node: usize, request: Frame) -> Frame {
    let store = match central.client() {
        Ok(store) => store,
        Err(e) => return error_reply(&e, node, Duration::ZERO),
    };
    let result = match request {
        Frame::Set { key, value } => store.set(&key, &value).map(|()| Frame::Done),
        Frame::TryGet { key } => store.try_get(&key).map(Frame::Value),
        Frame::Add { key, delta } => store.add(&key, delta).map(Frame::Int),
        Frame::CompareSet {
            key,
            expected,
            desired,
        } => store
            .compare_set(&key, expected.as_deref(), &desired)
            .map(|cs| Frame::Swapped {
                swapped: cs.swapped,
                current: cs.current,
            }),
        Frame::Delete { key } => store.delete(&key).map(Frame::Bool),
        Frame::NumKeys => store.num_keys().map(Frame::Count),
        other => Ok(Frame::Failed {
            message: format!("{} is not a request", frame_name(&other)),
        }),
    };
    result.unwrap_or_else(|e| error_reply(&e, node, Duration::ZERO))
}

/// The frame that carries an upstream error back to the local rank, as the central store would have sent it.
fn error_reply(e: &StoreError, node: usize, after: Duration) -> Frame {
    match e {
        StoreError::Timeout { missing, .. } => Frame::TimedOut {
            missing: missing.clone(),
            after,
        },
        StoreError::NotACounter { key, value } => Frame::NotACounter {
            key: key.clone(),
            value: value.clone().into_bytes(),
        },
        StoreError::CounterOverflow {
            key,
            current,
            delta,
        } => Frame::Overflow {
            key: key.clone(),
            current: *current,
            delta: *delta,
        },
        other => Frame::Failed {
            message: format!("the store relay of node {node} lost the central store: {other}"),
        },
    }
}
