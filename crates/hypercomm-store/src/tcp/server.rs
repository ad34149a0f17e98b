//! The TCP store server: one thread accepts, one thread serves each connection.

use std::collections::HashMap;
use std::io;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::frame::{
    DEFAULT_MAX_FRAME, Frame, NONCE_LEN, PROTOCOL_VERSION, ReadError, read_frame, write_frame,
};
use crate::secret::{SECRET_ENV, Secret, proof_matches, random_bytes};
use crate::{MemoryStore, Store, StoreError};

/// How a [`TcpStoreServer`] behaves.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The shared secret clients must prove they hold; `None` serves anyone who can connect.
    pub secret: Option<Secret>,
    /// The largest frame body accepted or sent, in bytes.
    pub max_frame: u32,
    /// Connections served at once; further clients are refused with a message until one closes.
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
            max_connections: 4096,
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
    /// The accept thread could not be started.
    #[error("cannot start store server thread: {0}")]
    Thread(#[source] io::Error),
}

/// A running store server. Dropping it (or calling [`TcpStoreServer::shutdown`]) stops accepting, closes every
/// connection, wakes every waiting request, and joins the server's threads.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    store: MemoryStore,
    options: ServerOptions,
    stopping: AtomicBool,
    conns: Mutex<Connections>,
    /// Signalled whenever a connection thread ends, so shutdown can wait for them all.
    conn_ended: Condvar,
}

#[derive(Debug, Default)]
struct Connections {
    next_id: u64,
    /// A second handle to each live connection's socket, so shutdown can unblock its thread.
    live: HashMap<u64, TcpStream>,
}

impl TcpStoreServer {
    /// Binds `addr` (port 0 picks a free port; see [`TcpStoreServer::local_addr`]) and starts serving.
    pub fn bind(
        addr: impl ToSocketAddrs + std::fmt::Display,
        options: ServerOptions,
    ) -> Result<Self, ServerError> {
        let shown = addr.to_string();
        let listener = TcpListener::bind(&addr).map_err(|source| ServerError::Bind {
            addr: shown.clone(),
            source,
        })?;
        let local = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: shown,
            source,
        })?;
        let shared = Arc::new(Shared {
            store: MemoryStore::new(),
            options,
            stopping: AtomicBool::new(false),
            conns: Mutex::new(Connections::default()),
            conn_ended: Condvar::new(),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("store-accept-{}", local.port()))
                .spawn(move || accept_loop(&shared, &listener))
                .map_err(ServerError::Thread)?
        };
        tracing::info!(addr = %local, auth = shared.options.secret.is_some(), "store server listening");
        Ok(TcpStoreServer {
            addr: local,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the server listens on, with the port the system picked when it was bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many client connections are open now.
    pub fn connections(&self) -> usize {
        self.shared.lock_conns().live.len()
    }

    /// Stops the server and waits (up to a few seconds) for its threads to finish. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.store.close();
        // Wake the accept thread out of its blocking accept by connecting to it.
        let woke =
            TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_secs(2)).is_ok();
        let mut conns = self.shared.lock_conns();
        for stream in conns.live.values() {
            // Unblocks the connection's thread if it is reading or writing; an error means it is already closed.
            let _ = stream.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !conns.live.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    left = conns.live.len(),
                    "store server connection threads did not stop in time"
                );
                break;
            }
            conns = self
                .shared
                .conn_ended
                .wait_timeout(conns, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
        drop(conns);
        if woke {
            // The accept loop exits as soon as it sees `stopping` after the wake-up connection.
            let _ = acceptor.join();
        } else {
            tracing::warn!(addr = %self.addr, "could not wake the store accept thread; leaving it detached");
        }
        tracing::info!(addr = %self.addr, "store server stopped");
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where to connect to reach a listener bound to `addr` (an unspecified address is reached over loopback).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

impl Shared {
    fn lock_conns(&self) -> MutexGuard<'_, Connections> {
        // Every critical section is a single map operation; a poisoned lock holds a consistent map.
        self.conns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "store server accept failed");
                // Out of file descriptors and similar conditions persist for a moment; don't spin on them.
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "unknown peer".to_owned(), |a| a.to_string());
        let id = {
            let mut conns = shared.lock_conns();
            // Checked again under the lock: shutdown sets `stopping` before it takes this lock to close every
            // live connection, so a connection registered here is either seen by shutdown or never served.
            if shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            if conns.live.len() >= shared.options.max_connections {
                drop(conns);
                tracing::warn!(%peer, max = shared.options.max_connections, "refusing connection: server full");
                refuse(
                    shared,
                    stream,
                    format!(
                        "server already has {} connections, its maximum",
                        shared.options.max_connections
                    ),
                );
                continue;
            }
            let Ok(second) = stream.try_clone() else {
                tracing::warn!(%peer, "cannot clone accepted socket; dropping connection");
                continue;
            };
            let id = conns.next_id;
            conns.next_id += 1;
            conns.live.insert(id, second);
            id
        };
        let spawned = {
            let shared = Arc::clone(shared);
            let peer = peer.clone();
            thread::Builder::new()
                .name(format!("store-conn-{id}"))
                .spawn(move || {
                    serve_connection(&shared, stream, &peer);
                    shared.lock_conns().live.remove(&id);
                    shared.conn_ended.notify_all();
                })
        };
        if let Err(e) = spawned {
            tracing::warn!(%peer, error = %e, "cannot start a thread for a store connection");
            if let Some(stream) = shared.lock_conns().live.remove(&id) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Tells a client why it is not served, then closes the connection.
fn refuse(shared: &Shared, mut stream: TcpStream, reason: String) {
    let _ = stream.set_write_timeout(Some(shared.options.handshake_timeout));
    let _ = write_frame(
        &mut stream,
        &Frame::Refused { reason },
        shared.options.max_frame,
    );
}

fn serve_connection(shared: &Shared, mut stream: TcpStream, peer: &str) {
    let options = &shared.options;
    let _ = stream.set_nodelay(true);
    if stream
        .set_read_timeout(Some(options.handshake_timeout))
        .is_err()
        || stream
            .set_write_timeout(Some(options.handshake_timeout))
            .is_err()
    {
        return;
    }
    match handshake(shared, &mut stream) {
        Ok(()) => {}
        Err(reason) => {
            tracing::warn!(%peer, %reason, "store handshake failed; closing connection");
            return;
        }
    }
    if stream.set_read_timeout(Some(options.idle_timeout)).is_err()
        || stream
            .set_write_timeout(Some(options.write_timeout))
            .is_err()
    {
        return;
    }
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let request = match read_frame(&mut stream, options.max_frame) {
            Ok(request) => request,
            Err(ReadError::Closed) => return,
            Err(ReadError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                tracing::debug!(%peer, "closing idle store connection");
                return;
            }
            Err(ReadError::Io(e)) => {
                if !shared.stopping.load(Ordering::SeqCst) {
                    tracing::warn!(%peer, error = %e, "store connection broke; closing it");
                }
                return;
            }
            Err(ReadError::Frame(e)) => {
                tracing::warn!(%peer, error = %e, "malformed frame from store client; closing its connection");
                let _ = write_frame(
                    &mut stream,
                    &Frame::Failed {
                        message: format!("malformed frame: {e}"),
                    },
                    options.max_frame,
                );
                return;
            }
        };
        let (reply, keep_open) = answer(shared, request);
        if let Err(e) = write_frame(&mut stream, &reply, options.max_frame) {
            if e.kind() == io::ErrorKind::InvalidInput {
                // The reply is over the frame limit: say so in a frame that fits, and carry on.
                let failed = Frame::Failed {
                    message: e.to_string(),
                };
                if write_frame(&mut stream, &failed, options.max_frame).is_ok() {
                    continue;
                }
            }
            tracing::warn!(%peer, error = %e, "cannot write store reply; closing connection");
            return;
        }
        if !keep_open {
            return;
        }
    }
}

/// Runs the challenge-response. `Err` holds the reason, already sent to the client when the client can use it.
fn handshake(shared: &Shared, stream: &mut TcpStream) -> Result<(), String> {
    let options = &shared.options;
    let nonce: [u8; NONCE_LEN] = random_bytes().map_err(|e| e.to_string())?;
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        auth_required: options.secret.is_some(),
        nonce,
    };
    write_frame(stream, &hello, options.max_frame)
        .map_err(|e| format!("cannot send hello: {e}"))?;
    let (version, client_nonce, mac) = match read_frame(stream, options.max_frame) {
        Ok(Frame::Auth {
            version,
            nonce,
            mac,
        }) => (version, nonce, mac),
        Ok(other) => {
            return Err(format!(
                "expected an auth frame, got {}",
                frame_name(&other)
            ));
        }
        Err(e) => return Err(format!("no auth frame: {e}")),
    };
    let refusal = if version != PROTOCOL_VERSION {
        Some(format!(
            "client speaks protocol version {version}, server speaks {PROTOCOL_VERSION}"
        ))
    } else {
        match (&options.secret, mac) {
            (None, _) => None,
            (Some(_), None) => Some(format!(
                "server requires the shared secret and the client sent none (set {SECRET_ENV})"
            )),
            (Some(secret), Some(mac)) => {
                (!proof_matches(&mac, &secret.client_proof(&nonce, &client_nonce)))
                    .then(|| "wrong shared secret".to_owned())
            }
        }
    };
    if let Some(reason) = refusal {
        let _ = write_frame(
            stream,
            &Frame::Refused {
                reason: reason.clone(),
            },
            options.max_frame,
        );
        return Err(reason);
    }
    let welcome = Frame::Welcome {
        mac: options
            .secret
            .as_ref()
            .map(|secret| secret.server_proof(&nonce, &client_nonce)),
    };
    write_frame(stream, &welcome, options.max_frame)
        .map_err(|e| format!("cannot send welcome: {e}"))
}

/// The reply to one request, and whether the connection stays open afterwards.
fn answer(shared: &Shared, request: Frame) -> (Frame, bool) {
    let store = &shared.store;
    let max_wait = shared.options.max_wait;
    let result = match request {
        Frame::Set { key, value } => store.set(&key, &value).map(|()| Frame::Done),
        Frame::TryGet { key } => store.try_get(&key).map(Frame::Value),
        Frame::Get { key, timeout } => store
            .get(&key, timeout.min(max_wait))
            .map(|v| Frame::Value(Some(v))),
        Frame::Wait { keys, timeout } => store
            .wait(&keys, timeout.min(max_wait))
            .map(|()| Frame::Done),
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
        other => {
            return (
                Frame::Failed {
                    message: format!("{} is not a request", frame_name(&other)),
                },
                false,
            );
        }
    };
    match result {
        Ok(reply) => (reply, true),
        Err(StoreError::Timeout { missing, after }) => (Frame::TimedOut { missing, after }, true),
        Err(StoreError::NotACounter { key, value }) => (
            Frame::NotACounter {
                key,
                value: value.into_bytes(),
            },
            true,
        ),
        Err(StoreError::CounterOverflow {
            key,
            current,
            delta,
        }) => (
            Frame::Overflow {
                key,
                current,
                delta,
            },
            true,
        ),
        Err(StoreError::Closed) => (
            Frame::Failed {
                message: "server is shutting down".into(),
            },
            false,
        ),
        Err(other) => (
            Frame::Failed {
                message: other.to_string(),
            },
            true,
        ),
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
