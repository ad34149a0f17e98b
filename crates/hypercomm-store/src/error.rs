//! The error type shared by every [`Store`](crate::Store) implementation.

use std::io;
use std::time::Duration;

use crate::Key;

/// What went wrong talking to a store. Every variant names the key, address or value involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Waited the full timeout and some keys never appeared.
    #[error("timed out after {after:?} waiting for {} key(s): {}", missing.len(), list(missing))]
    Timeout {
        /// The keys still missing when the timeout ran out.
        missing: Vec<Key>,
        /// How long the caller waited.
        after: Duration,
    },
    /// `add` was called on a key whose value is not a decimal 64-bit integer.
    #[error("key {key} holds {value:?}, not a decimal integer counter")]
    NotACounter {
        /// The key.
        key: Key,
        /// Its current value, lossily decoded for display.
        value: String,
    },
    /// `add` would overflow the 64-bit counter.
    #[error("adding {delta} to counter {key} (now {current}) overflows i64")]
    CounterOverflow {
        /// The key.
        key: Key,
        /// The counter's current value.
        current: i64,
        /// The requested increment.
        delta: i64,
    },
    /// A client could not reach the server before its connect deadline (refused, unreachable, or refused the
    /// handshake for a reason other than authentication).
    #[error("could not connect to store at {addr} within {after:?}: {source}")]
    Connect {
        /// The server address.
        addr: String,
        /// How long the client kept retrying.
        after: Duration,
        /// The last failure seen.
        #[source]
        source: io::Error,
    },
    /// The server did not answer within the client's I/O timeout.
    #[error("store at {addr} did not answer {op} within {after:?}")]
    NoReply {
        /// The server address.
        addr: String,
        /// The operation that went unanswered.
        op: &'static str,
        /// How long the client waited for the answer.
        after: Duration,
    },
    /// The server closed the connection, or the connection broke, during an operation.
    #[error("store at {addr} went away during {op}: {source}")]
    Disconnected {
        /// The server address.
        addr: String,
        /// The operation in progress.
        op: &'static str,
        /// What the socket reported.
        #[source]
        source: io::Error,
    },
    /// The server refused this client's credentials, or the server could not prove it holds the secret.
    #[error("authentication with store at {addr} failed: {reason}")]
    Auth {
        /// The server address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The peer sent bytes that are not a valid reply.
    #[error("store at {addr} broke the protocol: {detail}")]
    Protocol {
        /// The server address.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The server failed the request for a reason it reported as text.
    #[error("store at {addr} failed the request: {message}")]
    Remote {
        /// The server address.
        addr: String,
        /// The server's message.
        message: String,
    },
    /// A request does not fit in one frame.
    #[error("request of {len} bytes exceeds the store's frame limit of {max} bytes")]
    TooLarge {
        /// The encoded request size.
        len: u64,
        /// The frame limit in force.
        max: u32,
    },
    /// The store was shut down while the operation waited.
    #[error("the store was shut down")]
    Closed,
}

fn list(keys: &[Key]) -> String {
    const SHOWN: usize = 8;
    let mut out = keys
        .iter()
        .take(SHOWN)
        .map(Key::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > SHOWN {
        out.push_str(&format!(", and {} more", keys.len() - SHOWN));
    }
    out
}
