//! The server's event loop: one thread accepts, reads, answers and writes for every connection, woken by epoll
//! readiness through `mio`.
//!
//! Sockets are non-blocking and registered edge-triggered for reading and writing. A readable connection is read
//! in chunks of at most [`CHUNK`] bytes, each followed by answering the complete frames it holds, and yields after
//! [`CHUNKS_PER_TURN`] chunks so one busy client cannot starve the rest. Replies are queued per connection and
//! written as the socket takes them. Deadlines (handshake, idle, write, parked requests) sit in one timer heap
//! whose earliest entry bounds the wait for events; entries are checked against the connection when they fire,
//! so a deadline that moved later costs nothing until then.
//!
//! When `accept` fails because the process is out of file descriptors, the loop gives up a descriptor it keeps in
//! reserve, accepts the waiting client, tells it why it is refused (naming the open-file limit), closes it and
//! takes the reserve back, so clients get a reason instead of a hang and the listener never spins.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::connection::{Connection, Expiry, Phase, Received};
use super::dispatch::{Closing, Core};
use super::options::ServerOptions;
use super::requests;
use super::table::{Table, Waiter};
use super::upstream::StartUpstream;
use crate::frame::{Frame, encode_frame};
use crate::secret::random_bytes;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONNECTION: usize = 2;
/// Bytes read from a socket at a time.
pub(super) const CHUNK: usize = 64 * 1024;
/// Chunks one connection may read before the loop turns to the others.
const CHUNKS_PER_TURN: usize = 16;
/// Connections accepted before the loop turns to its other events.
const ACCEPTS_PER_TURN: usize = 512;
/// While a request is parked, later bytes are buffered only up to this much.
const PARKED_READ_AHEAD: usize = 64 * 1024;
/// The longest the loop sleeps without looking at its stop flag.
const TICK: Duration = Duration::from_secs(1);
/// How long to wait before accepting again when even the reserve descriptor is gone.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// How often, at most, running out of file descriptors is logged.
const FD_WARNING_EVERY: Duration = Duration::from_secs(5);

/// What the server's handle and its loop share.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Set by the handle to stop the loop.
    pub stopping: AtomicBool,
    /// Client connections open now.
    pub connections: AtomicUsize,
    /// Requests parked now (`get` or `wait` for keys not yet written), as of the loop's last turn.
    pub parked: AtomicUsize,
}

/// The loop's state. Built on the caller's thread by [`EventLoop::new`], then moved to its own thread to
/// [`EventLoop::run`].
pub(super) struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    core: Core,
    conns: HashMap<usize, Connection>,
    next_token: usize,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    scratch: Box<[u8]>,
    /// Connections to drive again this turn (a parked request was answered).
    ready: Vec<usize>,
    /// Connections that used up their turn with bytes still to read; driven on the next turn.
    deferred: Vec<usize>,
    /// Whether the listener may hold more connections than the last turn accepted.
    accept_more: bool,
    /// When to try accepting again after the reserve descriptor was lost.
    accept_retry_at: Option<Instant>,
    /// A descriptor held in reserve, released to refuse clients cleanly when the process runs out.
    reserve: Option<File>,
    fd_refusals: u64,
    fd_warned_at: Option<Instant>,
}

impl EventLoop {
    /// Takes over `listener` and returns the loop with a waker that interrupts its wait. `upstream`, for a
    /// relay, is called with that waker to make the forwarding half that answers requests instead of a table.
    pub fn new(
        listener: std::net::TcpListener,
        options: ServerOptions,
        shared: Arc<Shared>,
        upstream: Option<StartUpstream>,
    ) -> io::Result<(EventLoop, Arc<Waker>)> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let upstream = upstream
            .map(|start| start(Arc::clone(&waker)))
            .transpose()?;
        let event_loop = EventLoop {
            poll,
            listener,
            addr,
            shared,
            core: Core {
                options,
                table: Table::default(),
                upstream,
                woken: Vec::new(),
                next_seq: 0,
            },
            conns: HashMap::new(),
            next_token: FIRST_CONNECTION,
            timers: BinaryHeap::new(),
            scratch: vec![0; CHUNK].into_boxed_slice(),
            ready: Vec::new(),
            deferred: Vec::new(),
            accept_more: false,
            accept_retry_at: None,
            reserve: File::open("/dev/null").ok(),
            fd_refusals: 0,
            fd_warned_at: None,
        };
        Ok((event_loop, waker))
    }

    /// Serves until the stop flag is set, then tells parked clients the server is going away and closes every
    /// connection.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        while !self.shared.stopping.load(Ordering::SeqCst) {
            let timeout = self.wait_time(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(addr = %self.addr, error = %e, "store server cannot wait for events; stopping");
                break;
            }
            for event in &events {
                match event.token() {
                    LISTENER => self.accept_more = true,
                    WAKER => self.upstream_answers(),
                    Token(t) => {
                        if let Some(conn) = self.conns.get_mut(&t) {
                            if event.is_readable() || event.is_read_closed() || event.is_error() {
                                conn.may_read = true;
                            }
                            self.drive(t);
                        }
                    }
                }
                self.drain_ready();
            }
            for t in std::mem::take(&mut self.deferred) {
                self.drive(t);
            }
            self.drain_ready();
            let now = Instant::now();
            if self.accept_more && self.accept_retry_at.is_none_or(|at| now >= at) {
                self.accept();
            }
            self.fire_timers(Instant::now());
            self.drain_ready();
            self.shared
                .parked
                .store(self.core.table.parked(), Ordering::SeqCst);
        }
        self.stop();
    }

    /// How long to wait for events: until the earliest deadline, at most [`TICK`], not at all with work queued.
    fn wait_time(&self, now: Instant) -> Duration {
        let immediate =
            !self.deferred.is_empty() || (self.accept_more && self.accept_retry_at.is_none());
        if immediate {
            return Duration::ZERO;
        }
        let next = [
            self.timers.peek().map(|Reverse((at, _))| *at),
            self.accept_retry_at,
        ]
        .into_iter()
        .flatten()
        .min();
        next.map_or(TICK, |at| at.saturating_duration_since(now).min(TICK))
    }

    fn accept(&mut self) {
        self.accept_retry_at = None;
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_more = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if out_of_descriptors(&e) => {
                    if !self.refuse_for_descriptors(&e) {
                        self.accept_retry_at = Some(Instant::now() + ACCEPT_RETRY);
                        return;
                    }
                }
                // The client gave up before it was accepted: nothing to do for it.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    tracing::warn!(addr = %self.addr, error = %e, "store server accept failed; retrying shortly");
                    self.accept_retry_at = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
        // Possibly more waiting: `accept_more` stays set and the next turn continues.
    }

    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let max = self.core.options.max_connections;
        if self.conns.len() >= max {
            tracing::warn!(%peer, max, "refusing connection: server full");
            refuse(
                &mut stream,
                format!("server already has {max} connections, its maximum"),
                self.core.options.max_frame,
            );
            return;
        }
        let nonce = match random_bytes() {
            Ok(nonce) => nonce,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot make a handshake nonce; dropping connection");
                return;
            }
        };
        let _ = stream.set_nodelay(true);
        let token = self.next_token;
        self.next_token += 1;
        // Readable only: writability is asked for only while replies wait for room (see `watch_writes`), since
        // every ACK that frees send-buffer space would otherwise wake the loop for nothing.
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            tracing::warn!(%peer, error = %e, "cannot watch a store connection; dropping it");
            return;
        }
        let mut conn = Connection::new(stream, peer, nonce, Instant::now());
        conn.queue(
            &requests::hello(&self.core.options, nonce),
            self.core.options.max_frame,
        );
        self.conns.insert(token, conn);
        self.shared
            .connections
            .store(self.conns.len(), Ordering::SeqCst);
        self.drive(token);
    }

    /// Accepts one waiting client with the reserve descriptor and tells it the server is out of descriptors.
    /// Returns whether accepting may go on (false: the reserve is gone, so wait and retry).
    fn refuse_for_descriptors(&mut self, error: &io::Error) -> bool {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let limit = limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let reason = format!(
            "store server at {} is out of file descriptors ({error}): it holds {} client connections with an \
             open-file limit (RLIMIT_NOFILE) of {limit}; raise the limit (ulimit -n) where the server runs",
            self.addr,
            self.conns.len(),
        );
        let now = Instant::now();
        self.fd_refusals += 1;
        if self
            .fd_warned_at
            .is_none_or(|at| now.duration_since(at) >= FD_WARNING_EVERY)
        {
            tracing::warn!(refused = self.fd_refusals, "{reason}; refusing new clients");
            self.fd_warned_at = Some(now);
        }
        let Some(reserve) = self.reserve.take() else {
            self.reserve = File::open("/dev/null").ok();
            return false;
        };
        drop(reserve);
        let accepted = match self.listener.accept() {
            Ok((mut stream, _)) => {
                refuse(&mut stream, reason, self.core.options.max_frame);
                true
            }
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        self.reserve = File::open("/dev/null").ok();
        accepted && self.reserve.is_some()
    }

    /// Reads, answers and writes for connection `t` as far as it can go now, then files its next deadline.
    fn drive(&mut self, t: usize) {
        let mut chunks = 0;
        // Bounded: each pass either reads a chunk (at most CHUNKS_PER_TURN of them) or leaves the loop.
        let close = loop {
            let now = Instant::now();
            let Some(conn) = self.conns.get_mut(&t) else {
                return;
            };
            if let Some(reason) = self.core.answer_buffered(t, conn, now) {
                break Some(reason);
            }
            conn.compact();
            if let Err(e) = conn.flush(now) {
                break Some(Closing::Broken(e));
            }
            if matches!(conn.phase, Phase::Closing) {
                break (!conn.has_output()).then_some(Closing::Done);
            }
            let parked_full = conn.pending.is_some() && conn.unread() >= PARKED_READ_AHEAD;
            if !conn.may_read || parked_full {
                break None;
            }
            if chunks == CHUNKS_PER_TURN {
                self.deferred.push(t);
                break None;
            }
            chunks += 1;
            match conn.receive(&mut self.scratch, now) {
                Ok(Received::Bytes) => {}
                Ok(Received::Blocked) => {}
                Ok(Received::Closed) => {
                    // Answer what arrived before the close, then decide.
                    if let Some(reason) = self.core.answer_buffered(t, conn, now) {
                        break Some(reason);
                    }
                    if conn.unread() > 0 {
                        break Some(Closing::Truncated);
                    }
                    if conn.pending.is_some() {
                        break Some(Closing::GoneWhileParked);
                    }
                    conn.phase = Phase::Closing;
                }
                Err(e) => break Some(Closing::Broken(e)),
            }
        };
        match close {
            Some(reason) => self.close(t, reason),
            None => {
                self.watch_writes(t);
                self.schedule(t);
            }
        }
        self.release_woken();
    }

    /// Asks for writability events on connection `t` exactly while it has replies the socket has not taken.
    fn watch_writes(&mut self, t: usize) {
        let Some(conn) = self.conns.get_mut(&t) else {
            return;
        };
        let wanted = conn.has_output();
        if wanted == conn.watching_writes {
            return;
        }
        let interest = if wanted {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        // Re-registering reports readiness that already holds, so a socket that became writable in between is not
        // missed.
        match self
            .poll
            .registry()
            .reregister(&mut conn.stream, Token(t), interest)
        {
            Ok(()) => conn.watching_writes = wanted,
            Err(e) => self.close(t, Closing::Broken(e)),
        }
    }

    /// Re-checks every request released by the last writes: answers it, or parks it under its next missing key.
    fn release_woken(&mut self) {
        while let Some(waiter) = self.core.woken.pop() {
            let Some(conn) = self.conns.get_mut(&waiter.conn) else {
                continue;
            };
            let Some(pending) = conn.pending.as_mut().filter(|p| p.seq == waiter.seq) else {
                continue;
            };
            let Some(parked) = pending.parked.as_mut() else {
                continue;
            };
            match parked.poll(&self.core.table) {
                Some(reply) => {
                    conn.pending = None;
                    conn.queue(&reply, self.core.options.max_frame);
                    conn.touch(Instant::now());
                    self.ready.push(waiter.conn);
                }
                None => self.core.table.park(parked.watched(), waiter),
            }
        }
    }

    /// A relay's upstream answers: each goes to the connection whose request it answers, if still waiting.
    fn upstream_answers(&mut self) {
        let Some(upstream) = self.core.upstream.as_mut() else {
            return;
        };
        let now = Instant::now();
        for (waiter, reply) in upstream.finished(now) {
            let Some(conn) = self.conns.get_mut(&waiter.conn) else {
                continue;
            };
            if conn.pending.as_ref().is_none_or(|p| p.seq != waiter.seq) {
                continue;
            }
            conn.pending = None;
            conn.queue(&reply, self.core.options.max_frame);
            conn.touch(now);
            self.ready.push(waiter.conn);
        }
    }

    fn drain_ready(&mut self) {
        while let Some(t) = self.ready.pop() {
            self.drive(t);
        }
    }

    /// Files connection `t`'s earliest deadline in the timer heap, unless an entry at or before it is there.
    fn schedule(&mut self, t: usize) {
        let Some(conn) = self.conns.get_mut(&t) else {
            return;
        };
        let Some(at) = conn.deadline(&self.core.options) else {
            return;
        };
        if conn.scheduled.is_none_or(|s| at < s) {
            conn.scheduled = Some(at);
            self.timers.push(Reverse((at, t)));
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, t))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(conn) = self.conns.get_mut(&t) else {
                continue;
            };
            if conn.scheduled != Some(at) {
                continue;
            }
            conn.scheduled = None;
            match conn.expired(now, &self.core.options) {
                None => self.schedule(t),
                Some(Expiry::Wait) => {
                    if let Some(pending) = conn.pending.take() {
                        let waiter = Waiter {
                            conn: t,
                            seq: pending.seq,
                        };
                        let reply = match (&pending.parked, self.core.upstream.as_mut()) {
                            (Some(parked), _) => {
                                self.core.table.unpark(parked.watched(), waiter);
                                parked.timed_out(&self.core.table, pending.timeout)
                            }
                            (None, Some(upstream)) => upstream.expire(waiter, pending.timeout),
                            (None, None) => Frame::Failed {
                                message: "request lost by the server".into(),
                            },
                        };
                        conn.queue(&reply, self.core.options.max_frame);
                        conn.touch(now);
                    }
                    self.drive(t);
                }
                Some(expiry) => self.close(t, Closing::Expired(expiry)),
            }
        }
    }

    fn close(&mut self, t: usize, why: Closing) {
        let Some(mut conn) = self.conns.remove(&t) else {
            return;
        };
        if let Some(pending) = conn.pending.take() {
            let waiter = Waiter {
                conn: t,
                seq: pending.seq,
            };
            match (&pending.parked, self.core.upstream.as_mut()) {
                (Some(parked), _) => self.core.table.unpark(parked.watched(), waiter),
                (None, Some(upstream)) => upstream.forget(waiter),
                (None, None) => {}
            }
        }
        let peer = conn.peer;
        match why {
            Closing::Done => tracing::debug!(%peer, "store connection closed"),
            Closing::GoneWhileParked => {
                tracing::debug!(%peer, "store client went away while its request waited");
            }
            Closing::Truncated => {
                tracing::warn!(%peer, "store connection closed inside a frame; dropping it");
            }
            Closing::Broken(e) => {
                tracing::warn!(%peer, error = %e, "store connection broke; closing it");
            }
            Closing::Expired(Expiry::Idle) => {
                tracing::debug!(%peer, "closing idle store connection");
            }
            Closing::Expired(expiry) => {
                tracing::warn!(%peer, ?expiry, "store connection missed a deadline; closing it");
            }
            Closing::Refused(reason) => {
                tracing::warn!(%peer, %reason, "store handshake failed; closing connection");
            }
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.shared
            .connections
            .store(self.conns.len(), Ordering::SeqCst);
    }

    /// Tells every parked client the server is stopping, writes what the sockets take at once, closes everything.
    fn stop(mut self) {
        let max_frame = self.core.options.max_frame;
        let failed = Frame::Failed {
            message: "server is shutting down".into(),
        };
        let now = Instant::now();
        for conn in self.conns.values_mut() {
            if conn.pending.take().is_some() {
                conn.queue(&failed, max_frame);
                // Best effort: the socket is non-blocking, and a client that cannot take a short frame now will
                // see the connection close instead.
                let _ = conn.flush(now);
            }
        }
        self.conns.clear();
        self.shared.connections.store(0, Ordering::SeqCst);
        self.shared.parked.store(0, Ordering::SeqCst);
    }
}

/// Whether `accept` failed because this process or the whole system has no file descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)
    )
}

/// Sends a client the reason it is not served. The socket is new and empty, so the short frame fits in its send
/// buffer; if it does not, the client sees the connection close instead.
fn refuse(stream: &mut TcpStream, reason: String, max_frame: u32) {
    if let Ok(bytes) = encode_frame(&Frame::Refused { reason }, max_frame) {
        let _ = stream.write(&bytes);
    }
}
