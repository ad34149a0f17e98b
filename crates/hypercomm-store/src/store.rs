//! The [`Store`] trait: the operations rendezvous needs, and nothing else.

use std::time::Duration;

use crate::{Key, StoreError};

/// The result of [`Store::compare_set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompareSet {
    /// Whether the desired value was written.
    pub swapped: bool,
    /// The key's value after the operation (`None` when the key does not exist).
    pub current: Option<Vec<u8>>,
}

/// A key-value store shared by the ranks of a job.
///
/// Implementations are safe to share between threads. Every operation that waits takes an explicit timeout;
/// operations that do not wait still fail after the implementation's own I/O timeout rather than hang.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Writes `value` under `key`, replacing any previous value, and wakes every waiter on `key`.
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError>;

    /// The value under `key`, or `None` when it is absent. Never waits for the key.
    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError>;

    /// The value under `key`, waiting up to `timeout` for it to be set.
    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError>;

    /// Waits until every key in `keys` exists. On timeout the error lists the keys still missing.
    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError>;

    /// Atomically adds `delta` to the decimal counter under `key` (absent counts as 0) and returns the new value.
    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError>;

    /// Atomically writes `desired` if the current value equals `expected` (`None`: the key must be absent).
    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError>;

    /// Removes `key`; returns whether it existed.
    fn delete(&self, key: &Key) -> Result<bool, StoreError>;

    /// How many keys the store holds.
    fn num_keys(&self) -> Result<u64, StoreError>;
}

macro_rules! forward_store {
    ($($ptr:ident)::+) => {
        /// Forwards every operation to the store behind the pointer.
        impl<S: Store + ?Sized> Store for $($ptr)::+<S> {
            fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
                (**self).set(key, value)
            }
            fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
                (**self).try_get(key)
            }
            fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
                (**self).get(key, timeout)
            }
            fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
                (**self).wait(keys, timeout)
            }
            fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
                (**self).add(key, delta)
            }
            fn compare_set(
                &self,
                key: &Key,
                expected: Option<&[u8]>,
                desired: &[u8],
            ) -> Result<CompareSet, StoreError> {
                (**self).compare_set(key, expected, desired)
            }
            fn delete(&self, key: &Key) -> Result<bool, StoreError> {
                (**self).delete(key)
            }
            fn num_keys(&self) -> Result<u64, StoreError> {
                (**self).num_keys()
            }
        }
    };
}

forward_store!(std::sync::Arc);
forward_store!(Box);

/// Parses a counter value as stored by [`Store::add`]. Implementations share it so they agree on the format.
pub(crate) fn parse_counter(key: &Key, value: Option<&[u8]>) -> Result<i64, StoreError> {
    let Some(bytes) = value else { return Ok(0) };
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| StoreError::NotACounter {
            key: key.clone(),
            value: String::from_utf8_lossy(bytes).into_owned(),
        })
}

/// Adds `delta` to a parsed counter, naming the key on overflow.
pub(crate) fn checked_counter_add(key: &Key, current: i64, delta: i64) -> Result<i64, StoreError> {
    current
        .checked_add(delta)
        .ok_or_else(|| StoreError::CounterOverflow {
            key: key.clone(),
            current,
            delta,
        })
}
