//! The error type shared by every [`Store`](crate::Store) implementation.

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
