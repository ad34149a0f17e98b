//! The TCP store client: a small pool of authenticated connections to one server.

use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::frame::frame_name;
use crate::frame::{
    DEFAULT_MAX_FRAME, Frame, FrameError, NONCE_LEN, PROTOCOL_VERSION, ReadError, encode_frame,
    read_frame, write_frame,
};
use crate::secret::{SECRET_ENV, Secret, random_bytes};
use crate::{CompareSet, Key, Store, StoreError};

/// How a [`TcpStore`] client behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The shared secret, when the server demands one (see [`Secret::from_env`]).
    pub secret: Option<Secret>,
    /// How long [`TcpStore::connect`] keeps retrying while the server is not up yet.
    pub connect_timeout: Duration,
    /// How long any one request may take beyond the wait it asks for; also the deadline for opening an extra
    /// connection once the client is up.
    pub io_timeout: Duration,
    /// The largest frame body sent or accepted, in bytes. Must not exceed the server's.
    pub max_frame: u32,
    /// Idle connections kept for reuse. Concurrent callers each use their own connection, so a long `get` in one
    /// thread never blocks another.
    pub max_idle_connections: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            secret: None,
            connect_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            max_frame: DEFAULT_MAX_FRAME,
            max_idle_connections: 8,
        }
    }
}

impl ClientOptions {
    /// These options with `secret`.
    #[must_use]
    pub fn with_secret(mut self, secret: Option<Secret>) -> Self {
        self.secret = secret;
        self
    }

    /// These options with both timeouts set.
    #[must_use]
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Self {
        self.connect_timeout = connect;
        self.io_timeout = io;
        self
    }
}

/// A client of a [`TcpStoreServer`](super::TcpStoreServer). `Send + Sync`: share one per process (behind an `Arc`) among threads.
pub struct TcpStore {
    addr: String,
    resolved: Vec<SocketAddr>,
    options: ClientOptions,
    idle: Mutex<Vec<TcpStream>>,
}

impl fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.addr)
            .field("authenticated", &self.options.secret.is_some())
            .finish_non_exhaustive()
    }
}

/// Why one connection attempt failed: worth retrying, or final.
enum Attempt {
    Retry(io::Error),
    Fatal(StoreError),
}

impl TcpStore {
    /// Connects to the server at `addr`, retrying with backoff until `options.connect_timeout` passes, so the
    /// client may start before the server. A wrong or missing secret fails at once without retrying.
    pub fn connect(
        addr: impl ToSocketAddrs + fmt::Display,
        options: ClientOptions,
    ) -> Result<Self, StoreError> {
        let shown = addr.to_string();
        let started = Instant::now();
        let deadline = started + options.connect_timeout;
        let mut backoff = Duration::from_millis(10);
        let mut last: Option<io::Error> = None;
        // Bounded: every iteration sleeps at least 10 ms and the loop ends at the deadline.
        loop {
            match addr.to_socket_addrs() {
                Ok(resolved) => {
                    let resolved: Vec<SocketAddr> = resolved.collect();
                    let store = TcpStore {
                        addr: shown.clone(),
                        resolved,
                        options: options.clone(),
                        idle: Mutex::new(Vec::new()),
                    };
                    match store.open(deadline) {
                        Ok(stream) => {
                            store.lock_idle().push(stream);
                            return Ok(store);
                        }
                        Err(Attempt::Fatal(e)) => return Err(e),
                        Err(Attempt::Retry(e)) => keep_informative(&mut last, e),
                    }
                }
                Err(e) => keep_informative(&mut last, e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Connect {
                    addr: shown,
                    after: started.elapsed(),
                    source: last.unwrap_or_else(|| io::ErrorKind::TimedOut.into()),
                });
            }
            thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// The server address this client was given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn lock_idle(&self) -> MutexGuard<'_, Vec<TcpStream>> {
        // Critical sections are single Vec pushes and pops.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One attempt at a connection to any resolved address, handshake included.
    fn open(&self, deadline: Instant) -> Result<TcpStream, Attempt> {
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            "address resolved to no socket address",
        );
        for addr in &self.resolved {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Attempt::Retry(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connect deadline passed",
                )));
            }
            match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(5))) {
                Ok(stream) => return self.handshake(stream),
                Err(e) => last = e,
            }
        }
        Err(Attempt::Retry(last))
    }

    fn handshake(&self, mut stream: TcpStream) -> Result<TcpStream, Attempt> {
        let retry = Attempt::Retry;
        let max = self.options.max_frame;
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(self.options.io_timeout))
            .map_err(retry)?;
        stream
            .set_write_timeout(Some(self.options.io_timeout))
            .map_err(retry)?;
        let (auth_required, server_nonce) = match read_frame(&mut stream, max) {
            Ok(Frame::Hello {
                version,
                auth_required,
                nonce,
            }) => {
                if version != PROTOCOL_VERSION {
                    return Err(Attempt::Fatal(self.protocol(format!(
                        "server speaks protocol version {version}, client speaks {PROTOCOL_VERSION}"
                    ))));
                }
                (auth_required, nonce)
            }
            // A full server refuses before saying hello; that clears up when a connection closes.
            Ok(Frame::Refused { reason }) => return Err(retry(io::Error::other(reason))),
            Ok(other) => return Err(Attempt::Fatal(self.unexpected("hello", &other))),
            Err(ReadError::Frame(e)) => return Err(Attempt::Fatal(self.bad_frame(e))),
            Err(ReadError::Closed) => return Err(retry(io::ErrorKind::ConnectionAborted.into())),
            Err(ReadError::Io(e)) => return Err(retry(e)),
        };
        if auth_required && self.options.secret.is_none() {
            return Err(Attempt::Fatal(self.auth(format!(
                "the server requires a shared secret and this client has none (set {SECRET_ENV})"
            ))));
        }
        if !auth_required && self.options.secret.is_some() {
            return Err(Attempt::Fatal(self.auth(
                "this client has a shared secret but the server does not require one; give both the same secret"
                    .into(),
            )));
        }
        let client_nonce: [u8; NONCE_LEN] =
            random_bytes().map_err(|e| retry(io::Error::other(e.to_string())))?;
        let auth = Frame::Auth {
            version: PROTOCOL_VERSION,
            nonce: client_nonce,
            mac: self
                .options
                .secret
                .as_ref()
                .map(|s| s.client_proof(&server_nonce, &client_nonce)),
        };
        write_frame(&mut stream, &auth, max).map_err(retry)?;
        match read_frame(&mut stream, max) {
            Ok(Frame::Welcome { mac }) => match (&self.options.secret, mac) {
                (None, _) => Ok(stream),
                (Some(secret), Some(mac))
                    if secret.server_proof_matches(&server_nonce, &client_nonce, &mac) =>
                {
                    Ok(stream)
                }
                (Some(_), _) => Err(Attempt::Fatal(
                    self.auth("the server could not prove it holds the shared secret".into()),
                )),
            },
            Ok(Frame::Refused { reason }) => Err(Attempt::Fatal(self.auth(reason))),
            Ok(other) => Err(Attempt::Fatal(self.unexpected("welcome", &other))),
            Err(ReadError::Frame(e)) => Err(Attempt::Fatal(self.bad_frame(e))),
            Err(ReadError::Closed) => Err(retry(io::ErrorKind::ConnectionAborted.into())),
            Err(ReadError::Io(e)) => Err(retry(e)),
        }
    }

    /// An idle connection that is still open, or a new one.
    fn checkout(&self) -> Result<TcpStream, StoreError> {
        loop {
            let Some(stream) = self.lock_idle().pop() else {
                break;
            };
            if is_alive(&stream) {
                return Ok(stream);
            }
        }
        let deadline = Instant::now() + self.options.io_timeout;
        match self.open(deadline) {
            Ok(stream) => Ok(stream),
            Err(Attempt::Fatal(e)) => Err(e),
            Err(Attempt::Retry(source)) => Err(StoreError::Connect {
                addr: self.addr.clone(),
                after: self.options.io_timeout,
                source,
            }),
        }
    }

    fn checkin(&self, stream: TcpStream) {
        let mut idle = self.lock_idle();
        if idle.len() < self.options.max_idle_connections {
            idle.push(stream);
        }
    }

    /// Sends one request and reads its reply. `wait` is how long the server may legitimately take.
    fn call(&self, op: &'static str, request: &Frame, wait: Duration) -> Result<Frame, StoreError> {
        let max = self.options.max_frame;
        let bytes = encode_frame(request, max).map_err(|e| match e {
            FrameError::TooLarge { len, max } => StoreError::TooLarge { len, max },
            other => self.bad_frame(other),
        })?;
        let mut stream = self.checkout()?;
        let reply_within = wait.saturating_add(self.options.io_timeout);
        let io_err = |source: io::Error| self.io_error(op, reply_within, source);
        stream
            .set_read_timeout(Some(reply_within))
            .map_err(io_err)?;
        stream
            .set_write_timeout(Some(self.options.io_timeout))
            .map_err(io_err)?;
        stream.write_all(&bytes).map_err(io_err)?;
        let reply = match read_frame(&mut stream, max) {
            Ok(reply) => reply,
            Err(ReadError::Closed) => {
                return Err(io_err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
            Err(ReadError::Io(e)) => return Err(io_err(e)),
            Err(ReadError::Frame(e)) => return Err(self.bad_frame(e)),
        };
        if let Frame::Failed { message } = reply {
            // The server may close after a failure; don't reuse this connection.
            return Err(StoreError::Remote {
                addr: self.addr.clone(),
                message,
            });
        }
        self.checkin(stream);
        Ok(reply)
    }

    fn io_error(&self, op: &'static str, after: Duration, source: io::Error) -> StoreError {
        match source.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::NoReply {
                addr: self.addr.clone(),
                op,
                after,
            },
            io::ErrorKind::InvalidInput => StoreError::Protocol {
                addr: self.addr.clone(),
                detail: source.to_string(),
            },
            _ => StoreError::Disconnected {
                addr: self.addr.clone(),
                op,
                source,
            },
        }
    }

    fn auth(&self, reason: String) -> StoreError {
        StoreError::Auth {
            addr: self.addr.clone(),
            reason,
        }
    }

    fn protocol(&self, detail: String) -> StoreError {
        StoreError::Protocol {
            addr: self.addr.clone(),
            detail,
        }
    }

    fn bad_frame(&self, e: FrameError) -> StoreError {
        self.protocol(e.to_string())
    }

    fn unexpected(&self, wanted: &str, got: &Frame) -> StoreError {
        self.protocol(format!(
            "expected a {wanted} frame, got {}",
            frame_name(got)
        ))
    }
}

/// Remembers `new` as the reason for failing, unless it only says time ran out and an earlier, more telling
/// reason (refused, server full) is already known.
fn keep_informative(last: &mut Option<io::Error>, new: io::Error) {
    if last.is_none() || new.kind() != io::ErrorKind::TimedOut {
        *last = Some(new);
    }
}

/// Whether an idle connection is still usable: no EOF and no stray bytes waiting on it.
fn is_alive(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut probe = [0u8; 1];
    let alive = matches!(stream.peek(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    alive && stream.set_nonblocking(false).is_ok()
}

impl Store for TcpStore {
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
        let request = Frame::Set {
            key: key.clone(),
            value: value.to_vec(),
        };
        match self.call("set", &request, Duration::ZERO)? {
            Frame::Done => Ok(()),
            other => Err(self.unexpected("done", &other)),
        }
    }

    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        match self.call(
            "try_get",
            &Frame::TryGet { key: key.clone() },
            Duration::ZERO,
        )? {
            Frame::Value(value) => Ok(value),
            other => Err(self.unexpected("value", &other)),
        }
    }

    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let request = Frame::Get {
            key: key.clone(),
            timeout,
        };
        match self.call("get", &request, timeout)? {
            Frame::Value(Some(value)) => Ok(value),
            Frame::TimedOut { missing, .. } => Err(StoreError::Timeout {
                missing,
                after: timeout,
            }),
            other => Err(self.unexpected("value", &other)),
        }
    }

    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
        let request = Frame::Wait {
            keys: keys.to_vec(),
            timeout,
        };
        match self.call("wait", &request, timeout)? {
            Frame::Done => Ok(()),
            Frame::TimedOut { missing, .. } => Err(StoreError::Timeout {
                missing,
                after: timeout,
            }),
            other => Err(self.unexpected("done", &other)),
        }
    }

    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
        let request = Frame::Add {
            key: key.clone(),
            delta,
        };
        match self.call("add", &request, Duration::ZERO)? {
            Frame::Int(n) => Ok(n),
            Frame::NotACounter { key, value } => Err(StoreError::NotACounter {
                key,
                value: String::from_utf8_lossy(&value).into_owned(),
            }),
            Frame::Overflow {
                key,
                current,
                delta,
            } => Err(StoreError::CounterOverflow {
                key,
                current,
                delta,
            }),
            other => Err(self.unexpected("int", &other)),
        }
    }

    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        let request = Frame::CompareSet {
            key: key.clone(),
            expected: expected.map(<[u8]>::to_vec),
            desired: desired.to_vec(),
        };
        match self.call("compare_set", &request, Duration::ZERO)? {
            Frame::Swapped { swapped, current } => Ok(CompareSet { swapped, current }),
            other => Err(self.unexpected("swapped", &other)),
        }
    }

    fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        match self.call(
            "delete",
            &Frame::Delete { key: key.clone() },
            Duration::ZERO,
        )? {
            Frame::Bool(existed) => Ok(existed),
            other => Err(self.unexpected("bool", &other)),
        }
    }

    fn num_keys(&self) -> Result<u64, StoreError> {
        match self.call("num_keys", &Frame::NumKeys, Duration::ZERO)? {
            Frame::Count(n) => Ok(n),
            other => Err(self.unexpected("count", &other)),
        }
    }
}
