//! [`ServerOptions`]: how a store server behaves. A room of its own below the server, so that every part of the
//! serving (connections, requests, the event loop) can read the options without importing the server.

use std::time::Duration;

use crate::frame::DEFAULT_MAX_FRAME;
use crate::secret::Secret;

/// How a [`TcpStoreServer`](super::TcpStoreServer) behaves.
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
