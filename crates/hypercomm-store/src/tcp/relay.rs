//! [`StoreRelay`]: one per node, serving the node's ranks and forwarding to the central store, so the central
//! store sees a few connections per node instead of every rank.
//!
//! A relay speaks the store protocol to local ranks (same handshake, same secret, same frames) on the same event
//! loop as a server, and forwards each request upstream with a [`TcpStore`] client. Identical waits from many
//! local ranks (`get` of one key, `wait` on one list of keys) become one upstream call whose answer goes to all
//! of them. `hypercomm launch` starts one on each node and tells its ranks where it is through
//! [`RELAY_ADDR_ENV`]; [`Rendezvous::join`](crate::Rendezvous::join) then connects there, naming the node in
//! every error. A rank started without a launcher talks to the store directly.
//!
//! When the relay dies, only its node's ranks lose the store, and their errors name the node's relay; when the
//! central store dies, every relay reports that to its ranks in the failure it forwards.
//!
//! ```
//! use hypercomm_store::{ClientOptions, Key, ServerOptions, Store, StoreRelay, TcpStore};
//!
//! let central = TcpStore::server("127.0.0.1:0", ServerOptions::default())?;
//! let relay = StoreRelay::start("127.0.0.1:0", central.local_addr(), 3, ServerOptions::default(),
//!                               ClientOptions::default())?;
//! let rank = TcpStore::connect(relay.local_addr(), ClientOptions::default())?;
//! rank.set(&Key::new("via").push(3u64), b"relay")?;
//! let direct = TcpStore::connect(central.local_addr(), ClientOptions::default())?;
//! assert_eq!(direct.try_get(&Key::new("via").push(3u64))?.unwrap(), b"relay");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ClientOptions;
use super::options::ServerOptions;
use super::server::{ServerError, TcpStoreServer};
use super::upstream::{Central, RelayCounts, Upstream};

/// The variable through which `hypercomm launch` tells its ranks the `host:port` of their node's relay.
pub const RELAY_ADDR_ENV: &str = "HYPERCOMM_STORE_RELAY";

/// Idle connections the relay keeps to the central store between calls.
const UPSTREAM_IDLE: usize = 4;

/// Where a rank reaches its node's relay. Shown as "the relay of node N at HOST:PORT", so every error of a client
/// connected through it names the node.
#[derive(Debug, Clone)]
pub(crate) struct NodeRelay {
    addr: crate::StoreAddr,
    node: usize,
}

impl NodeRelay {
    /// The relay of `node`, listening at `addr`.
    pub(crate) fn new(addr: crate::StoreAddr, node: usize) -> Self {
        NodeRelay { addr, node }
    }
}

impl fmt::Display for NodeRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the relay of node {} at {}", self.node, self.addr)
    }
}

impl ToSocketAddrs for NodeRelay {
    type Iter = std::vec::IntoIter<SocketAddr>;

    fn to_socket_addrs(&self) -> std::io::Result<Self::Iter> {
        (self.addr.host.as_str(), self.addr.port).to_socket_addrs()
    }
}

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The relay's own listener or event loop could not start.
    #[error("the store relay of node {node} cannot serve: {source}")]
    Serve {
        /// The node whose relay this is.
        node: usize,
        /// Why.
        #[source]
        source: ServerError,
    },
}

/// A running per-node relay. Dropping it (or [`StoreRelay::shutdown`]) stops serving the node's ranks.
#[derive(Debug)]
pub struct StoreRelay {
    server: TcpStoreServer,
    node: usize,
    upstream: String,
    counts: Arc<RelayCounts>,
}

impl StoreRelay {
    /// Serves on `bind` for the ranks of node `node`, forwarding to the central store at `upstream`.
    /// `server.secret` is demanded of local ranks; `client.secret` is presented upstream (a job uses the same
    /// secret for both). The relay connects upstream on the first request, retrying until
    /// `client.connect_timeout`, so it may start before the central store; a failure to reach it is then the
    /// error of that request, naming this node.
    pub fn start(
        bind: impl ToSocketAddrs + fmt::Display,
        upstream: impl ToSocketAddrs + fmt::Display,
        node: usize,
        server: ServerOptions,
        client: ClientOptions,
    ) -> Result<StoreRelay, RelayError> {
        let upstream_shown = upstream.to_string();
        let client = ClientOptions {
            max_idle_connections: UPSTREAM_IDLE,
            ..client
        };
        let io_timeout = client.io_timeout;
        let store = Central::new(upstream_shown.clone(), client);
        let counts = Arc::new(RelayCounts::default());
        let upstream_counts = Arc::clone(&counts);
        let server = TcpStoreServer::start(
            bind,
            server,
            Some(Box::new(move |waker| {
                Upstream::start(store, io_timeout, node, waker, upstream_counts)
            })),
        )
        .map_err(|source| RelayError::Serve { node, source })?;
        tracing::info!(node, addr = %server.local_addr(), upstream = %upstream_shown, "store relay serving");
        Ok(StoreRelay {
            server,
            node,
            upstream: upstream_shown,
            counts,
        })
    }

    /// Where the node's ranks connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The node this relay serves.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The central store's address, as given.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Connections from local ranks open now.
    pub fn connections(&self) -> usize {
        self.server.connections()
    }

    /// Requests received from local ranks so far.
    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::Relaxed)
    }

    /// Calls made to the central store so far: at most [`StoreRelay::requests`], fewer when waits were shared.
    pub fn upstream_calls(&self) -> u64 {
        self.counts.upstream_calls.load(Ordering::Relaxed)
    }

    /// Stops serving: local ranks' connections close and their calls fail naming this node's relay. Idempotent.
    pub fn shutdown(&mut self) {
        self.server.shutdown();
    }
}
