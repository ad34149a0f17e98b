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

use super::event_loop::{EventLoop, Shared};
use super::options::ServerOptions;
use super::upstream::StartUpstream;

/// Pending connections the kernel may queue before the server accepts them. Linux caps it at
/// `net.core.somaxconn` (4096 by default since 5.4); a large queue keeps a burst of thousands of ranks connecting
/// at once from waiting out SYN retransmissions.
const LISTEN_BACKLOG: i32 = 65_535;

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

impl super::TcpStore {
    /// Starts a server in this process; shorthand for [`TcpStoreServer::bind`]. (Defined with the server, so the
    /// client's module does not import the server's.)
    pub fn server(
        bind: impl ToSocketAddrs + std::fmt::Display,
        options: ServerOptions,
    ) -> Result<TcpStoreServer, ServerError> {
        TcpStoreServer::bind(bind, options)
    }
}
