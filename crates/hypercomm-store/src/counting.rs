//! [`CountingStore`]: a store wrapper that counts the operations and bytes one client sends through it.
//!
//! Give each rank of a simulation its own `CountingStore` around one shared store, and the counts say what each
//! rank costs the store: the number of requests, and the bytes of keys and values sent and received (in the wire
//! encoding a TCP store would use, so the figures carry over).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{CompareSet, Key, Store, StoreError};

/// What one client sent through a [`CountingStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// `set` calls.
    pub sets: u64,
    /// `get` and `try_get` calls.
    pub gets: u64,
    /// `wait` calls.
    pub waits: u64,
    /// `add` calls.
    pub adds: u64,
    /// `compare_set`, `delete` and `num_keys` calls.
    pub other: u64,
    /// Bytes of encoded keys and of values sent to the store.
    pub bytes_sent: u64,
    /// Bytes of values received from the store.
    pub bytes_received: u64,
}

impl StoreCounts {
    /// Every request, of any kind.
    pub fn requests(&self) -> u64 {
        self.sets + self.gets + self.waits + self.adds + self.other
    }

    /// Bytes in both directions.
    pub fn bytes(&self) -> u64 {
        self.bytes_sent + self.bytes_received
    }
}

#[derive(Debug, Default)]
struct Counters {
    sets: AtomicU64,
    gets: AtomicU64,
    waits: AtomicU64,
    adds: AtomicU64,
    other: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

/// Wraps a store and counts what passes through it. The counts are this wrapper's alone.
///
/// ```
/// use std::time::Duration;
/// use hypercomm_store::{CountingStore, Key, MemoryStore, Store};
///
/// let store = CountingStore::new(MemoryStore::new());
/// store.set(&Key::new("k"), b"12345")?;
/// store.get(&Key::new("k"), Duration::from_secs(1))?;
/// let counts = store.counts();
/// assert_eq!((counts.sets, counts.gets, counts.requests()), (1, 1, 2));
/// assert_eq!(counts.bytes_received, 5);
/// # Ok::<(), hypercomm_store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: S,
    counters: Counters,
}

impl<S: Store> CountingStore<S> {
    /// Counts what passes through to `inner`.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            counters: Counters::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> StoreCounts {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreCounts {
            sets: load(&c.sets),
            gets: load(&c.gets),
            waits: load(&c.waits),
            adds: load(&c.adds),
            other: load(&c.other),
            bytes_sent: load(&c.sent),
            bytes_received: load(&c.received),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn count(&self, op: &AtomicU64, sent: usize) {
        op.fetch_add(1, Ordering::Relaxed);
        self.counters.sent.fetch_add(sent as u64, Ordering::Relaxed);
    }

    fn received(&self, bytes: usize) {
        self.counters
            .received
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl<S: Store> Store for CountingStore<S> {
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
        self.count(&self.counters.sets, key.encoded_len() + value.len());
        self.inner.set(key, value)
    }

    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        self.count(&self.counters.gets, key.encoded_len());
        let value = self.inner.try_get(key)?;
        self.received(value.as_ref().map_or(0, Vec::len));
        Ok(value)
    }

    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.count(&self.counters.gets, key.encoded_len());
        let value = self.inner.get(key, timeout)?;
        self.received(value.len());
        Ok(value)
    }

    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
        self.count(
            &self.counters.waits,
            keys.iter().map(Key::encoded_len).sum(),
        );
        self.inner.wait(keys, timeout)
    }

    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
        self.count(&self.counters.adds, key.encoded_len() + 8);
        let value = self.inner.add(key, delta)?;
        self.received(8);
        Ok(value)
    }

    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        self.count(
            &self.counters.other,
            key.encoded_len() + expected.map_or(0, <[u8]>::len) + desired.len(),
        );
        let result = self.inner.compare_set(key, expected, desired)?;
        self.received(result.current.as_ref().map_or(0, Vec::len));
        Ok(result)
    }

    fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.count(&self.counters.other, key.encoded_len());
        self.inner.delete(key)
    }

    fn num_keys(&self) -> Result<u64, StoreError> {
        self.count(&self.counters.other, 0);
        self.inner.num_keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn counts_each_operation_and_its_bytes() {
        let shared = Arc::new(MemoryStore::new());
        let a = CountingStore::new(Arc::clone(&shared));
        let b = CountingStore::new(Arc::clone(&shared));
        let key = Key::new("k").push(1u64);
        a.set(&key, b"abc").unwrap();
        assert_eq!(b.try_get(&key).unwrap().as_deref(), Some(&b"abc"[..]));
        b.wait(std::slice::from_ref(&key), Duration::from_secs(1))
            .unwrap();
        assert_eq!(b.add(&Key::new("n"), 2).unwrap(), 2);
        b.compare_set(&Key::new("c"), None, b"x").unwrap();
        assert!(b.delete(&Key::new("c")).unwrap());
        b.num_keys().unwrap();
        let (ca, cb) = (a.counts(), b.counts());
        assert_eq!((ca.sets, ca.requests()), (1, 1));
        assert_eq!(ca.bytes_sent, key.encoded_len() as u64 + 3);
        assert_eq!((cb.gets, cb.waits, cb.adds, cb.other), (1, 1, 1, 3));
        assert_eq!(cb.bytes_received, 3 + 8 + 1);
        // A failed wait still counts as a request.
        let err = a.get(&Key::new("missing"), Duration::from_millis(10));
        assert!(err.is_err());
        assert_eq!(a.counts().gets, 1);
    }
}
