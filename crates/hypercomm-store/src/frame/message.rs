//! The protocol's vocabulary: the [`Frame`] messages a store client and server exchange, and the constants both
//! sides agree on (protocol version, nonce length, default maximum frame). How a frame becomes bytes is the
//! business of `codec` and `stream`; this file knows nothing of bytes.

use std::time::Duration;

use crate::Key;
use crate::mac::DIGEST_LEN;

/// The largest frame body accepted by default: 64 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 64 << 20;

/// Version of the handshake and frame layout; a server refuses a client speaking another.
pub const PROTOCOL_VERSION: u8 = 1;

/// Length of a handshake nonce in bytes.
pub const NONCE_LEN: usize = 32;

/// One message between a store client and server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    // ----- handshake -----
    /// Server → client, first frame on a connection.
    Hello {
        /// The server's [`PROTOCOL_VERSION`].
        version: u8,
        /// Whether the server demands the shared secret.
        auth_required: bool,
        /// Fresh random bytes the client must key-hash.
        nonce: [u8; NONCE_LEN],
    },
    /// Client → server, answering `Hello`.
    Auth {
        /// The client's [`PROTOCOL_VERSION`].
        version: u8,
        /// Fresh random bytes the server must key-hash back, proving it knows the secret too.
        nonce: [u8; NONCE_LEN],
        /// The client's proof, present when the client holds a secret.
        mac: Option<[u8; DIGEST_LEN]>,
    },
    /// Server → client: the connection is accepted.
    Welcome {
        /// The server's proof, present when the server holds a secret.
        mac: Option<[u8; DIGEST_LEN]>,
    },
    /// Server → client: the connection is refused; the server closes it after this frame.
    Refused {
        /// Why, for the client's error message.
        reason: String,
    },

    // ----- requests -----
    /// Write a value.
    Set {
        /// The key.
        key: Key,
        /// The value.
        value: Vec<u8>,
    },
    /// Read a value without waiting.
    TryGet {
        /// The key.
        key: Key,
    },
    /// Read a value, waiting up to `timeout` for it.
    Get {
        /// The key.
        key: Key,
        /// How long the server may wait.
        timeout: Duration,
    },
    /// Wait until every key exists.
    Wait {
        /// The keys.
        keys: Vec<Key>,
        /// How long the server may wait.
        timeout: Duration,
    },
    /// Atomically add to a counter.
    Add {
        /// The counter's key.
        key: Key,
        /// The increment.
        delta: i64,
    },
    /// Atomically replace a value if it matches.
    CompareSet {
        /// The key.
        key: Key,
        /// The value required now (`None`: absent).
        expected: Option<Vec<u8>>,
        /// The value to write.
        desired: Vec<u8>,
    },
    /// Remove a key.
    Delete {
        /// The key.
        key: Key,
    },
    /// Count the keys.
    NumKeys,

    // ----- replies -----
    /// The request succeeded and returns nothing.
    Done,
    /// A value, or `None` for an absent key.
    Value(Option<Vec<u8>>),
    /// A counter value.
    Int(i64),
    /// A yes/no answer (whether a deleted key existed).
    Bool(bool),
    /// The outcome of a compare-and-set.
    Swapped {
        /// Whether the value was written.
        swapped: bool,
        /// The value afterwards.
        current: Option<Vec<u8>>,
    },
    /// A key count.
    Count(u64),
    /// A wait ran out of time.
    TimedOut {
        /// Keys still missing.
        missing: Vec<Key>,
        /// How long the server waited.
        after: Duration,
    },
    /// `Add` found a value that is not a counter.
    NotACounter {
        /// The key.
        key: Key,
        /// Its value.
        value: Vec<u8>,
    },
    /// `Add` would overflow.
    Overflow {
        /// The key.
        key: Key,
        /// Its current value.
        current: i64,
        /// The increment.
        delta: i64,
    },
    /// Any other failure, as text.
    Failed {
        /// What went wrong.
        message: String,
    },
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
