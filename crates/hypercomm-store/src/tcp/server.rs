//! The TCP store server's public face: its options, its errors, and the handle that starts and stops it.
//!
//! The serving itself is event-driven (see `event_loop`): one thread multiplexes every connection, so a client,
//! idle or waiting in a long `get`, costs a few hundred bytes and a registration rather than a thread. The number
//! of connections is bounded by the process's open-file limit (`RLIMIT_NOFILE`); a client turned away because
//! the limit is reached is told so, with the limit in the message.

use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::event_loop::{EventLoop, Shared};
use super::upstream::Upstream;
use crate::frame::{DEFAULT_MAX_FRAME, Frame};
use crate::secret::Secret;

/// Pending connections the kernel may queue before the server accepts them. Linux caps it at
/// `net.core.somaxconn` (4096 by default since 5.4); a large queue keeps a burst of thousands of ranks connecting
/// at once from waiting out SYN retransmissions.
const LISTEN_BACKLOG: i32 = 65_535;

/// Makes a relay's forwarding half, given the waker of the event loop it will answer through.
pub(super) type StartUpstream = Box<dyn FnOnce(Arc<mio::Waker>) -> io::Result<Upstream> + Send>;

/// How a [`TcpStoreServer`] behaves.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The shared secret clients must prove they hold; `None` serves anyone who can connect.
    pub secret: Option<Secret>,
    /// The largest frame body accepted or sent, in bytes.
    pub max_frame: u32,
    /// Connections served at once; further clients are refused with a message until one closes. By default
    /// there is no cap of the server's own: the process's open-file limit (`RLIMIT_NOFILE`) is the limit, and a
    /// client refused for it is told the limit.
    pub max_connections: usize,
    /// How long a new connection has to complete the handshake.
    pub handshake_timeout: Duration,
    /// How long a connection may sit idle between requests before the server closes it. Clients reopen closed
    /// connections transparently.
    pub idle_timeout: Duration,
    /// How long the server waits to write one reply before giving up on the connection.
    pub write_timeout: Duration,
    /// The longest a single get or wait may keep a connection waiting, whatever the client asked for.
    pub max_wait: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            secret: None,
            max_frame: DEFAULT_MAX_FRAME,
            max_connections: usize::MAX,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            write_timeout: Duration::from_secs(30),
            max_wait: Duration::from_secs(24 * 3600),
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address did not resolve or could not be bound.
    #[error("cannot bind store server to {addr}: {source}")]
    Bind {
        /// The requested address.
        addr: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// The server's thread could not be started.
    #[error("cannot start store server thread: {0}")]
    Thread(#[source] io::Error),
    /// The event loop (epoll instance, waker) could not be set up.
    #[error("cannot set up the store server's event loop on {addr}: {source}")]
    EventLoop {
        /// The bound address.
        addr: SocketAddr,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
}

/// A running store server. Dropping it (or calling [`TcpStoreServer::shutdown`]) stops accepting, answers every
/// waiting request with a failure, closes every connection, and joins the server's thread.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    waker: Arc<mio::Waker>,
    thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds `addr` (port 0 picks a free port; see [`TcpStoreServer::local_addr`]) and starts serving.
    pub fn bind(
        addr: impl ToSocketAddrs + std::fmt::Display,
        options: ServerOptions,
    ) -> Result<Self, ServerError> {
        TcpStoreServer::start(addr, options, None)
    }

    /// [`TcpStoreServer::bind`], answering requests through `upstream` (a relay) instead of a table when given.
    pub(super) fn start(
        addr: impl ToSocketAddrs + std::fmt::Display,
        options: ServerOptions,
        upstream: Option<StartUpstream>,
    ) -> Result<Self, ServerError> {
        let shown = addr.to_string();
        let bind_error = |source| ServerError::Bind {
            addr: shown.clone(),
            source,
        };
        let listener = TcpListener::bind(&addr).map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        // Listening again on a listening socket only changes its backlog (Linux); std listens with 128.
        rustix::net::listen(&listener, LISTEN_BACKLOG).map_err(|e| bind_error(e.into()))?;
        let shared = Arc::new(Shared::default());
        let auth = options.secret.is_some();
        let (event_loop, waker) = EventLoop::new(listener, options, Arc::clone(&shared), upstream)
            .map_err(|source| ServerError::EventLoop {
                addr: local,
                source,
            })?;
        let thread = thread::Builder::new()
            .name(format!("store-{}", local.port()))
            .spawn(move || event_loop.run())
            .map_err(ServerError::Thread)?;
        tracing::info!(addr = %local, auth, "store server listening");
        Ok(TcpStoreServer {
            addr: local,
            shared,
            waker,
            thread: Some(thread),
        })
    }

    /// The address the server listens on, with the port the system picked when it was bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many client connections are open now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many `get` and `wait` requests are waiting for keys now (as of the event loop's last turn). Each costs
    /// an entry in the table of waiters, not a thread.
    pub fn waiting(&self) -> usize {
        self.shared.parked.load(Ordering::SeqCst)
    }

    /// Stops the server and waits for its thread to finish. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Err(e) = self.waker.wake() {
            // The loop still sees the flag within its one-second tick.
            tracing::debug!(error = %e, "cannot wake the store event loop");
        }
        // The loop checks the flag at least once a second and then only closes sockets, so this join ends.
        if thread.join().is_err() {
            tracing::warn!(addr = %self.addr, "store server thread panicked");
        }
        tracing::info!(addr = %self.addr, "store server stopped");
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A short name for a frame's type, for log and error messages.
pub(crate) fn frame_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "hello",
        Frame::Auth { .. } => "auth",
        Frame::Welcome { .. } => "welcome",
        Frame::Refused { .. } => "refused",
        Frame::Set { .. } => "set",
        Frame::TryGet { .. } => "try_get",
        Frame::Get { .. } => "get",
        Frame::Wait { .. } => "wait",
        Frame::Add { .. } => "add",
        Frame::CompareSet { .. } => "compare_set",
        Frame::Delete { .. } => "delete",
        Frame::NumKeys => "num_keys",
        Frame::Done => "done",
        Frame::Value(_) => "value",
        Frame::Int(_) => "int",
        Frame::Bool(_) => "bool",
        Frame::Swapped { .. } => "swapped",
        Frame::Count(_) => "count",
        Frame::TimedOut { .. } => "timed_out",
        Frame::NotACounter { .. } => "not_a_counter",
        Frame::Overflow { .. } => "overflow",
        Frame::Failed { .. } => "failed",
    }
}
