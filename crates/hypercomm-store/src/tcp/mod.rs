//! [`TcpStore`]: the store shared by the processes of a job, served over TCP.
//!
//! One process runs a [`TcpStoreServer`] (a rank hosts it in-process with [`TcpStore::server`], or it runs
//! standalone as `hypercomm store --bind ADDR:PORT`); every rank connects a [`TcpStore`] client to it and uses it
//! through the [`Store`](crate::Store) trait.
//!
//! - Ranks may start in any order: a client retries connecting, with backoff, until its connect deadline.
//! - Every call has a deadline: a server that stops answering or goes away is an error naming its address.
//! - With a [`Secret`](crate::Secret) the server demands a challenge-response before serving a connection, and the
//!   client checks that the server holds the same secret.
//! - A malformed, truncated or oversized frame closes only the connection that sent it.
//! - The server is event-driven: one thread serves every connection, and a `get` or `wait` for a key not yet
//!   written costs a registration, not a thread. Its connection limit is the open-file limit, which a refused
//!   client is told.
//! - A [`StoreRelay`] on each node serves that node's ranks and forwards to the central store over a few
//!   connections, folding identical waits into one.
//!
//! ```
//! use std::time::Duration;
//! use hypercomm_store::{ClientOptions, Key, ServerOptions, Store, TcpStore};
//!
//! let server = TcpStore::server("127.0.0.1:0", ServerOptions::default())?;
//! let client = TcpStore::connect(server.local_addr(), ClientOptions::default())?;
//! client.set(&Key::new("hello").push(0u64), b"world")?;
//! assert_eq!(client.get(&Key::new("hello").push(0u64), Duration::from_secs(5))?, b"world");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;
mod connection;
mod dispatch;
mod event_loop;
mod options;
mod relay;
mod requests;
mod server;
mod table;
mod upstream;

pub use client::{ClientOptions, TcpStore};
pub use options::ServerOptions;
pub(crate) use relay::NodeRelay;
pub use relay::{RELAY_ADDR_ENV, RelayError, StoreRelay};
pub use server::{ServerError, TcpStoreServer};

#[cfg(test)]
mod tests;
