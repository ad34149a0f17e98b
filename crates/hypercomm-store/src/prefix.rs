//! [`PrefixStore`]: one store seen through a key prefix, so independent users of a store never collide.

use std::time::Duration;

use crate::{CompareSet, Key, Store, StoreError};

/// A view of `inner` in which every key is `prefix` followed by the caller's key.
///
/// Because keys are structured, the prefix cannot blend into the key: `PrefixStore("a")` with key `"bc"` and
/// `PrefixStore("ab")` with key `"c"` name different entries.
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_store::{Key, MemoryStore, PrefixStore, Store};
///
/// let shared = Arc::new(MemoryStore::new());
/// let tp = PrefixStore::new(Key::new("group").push("tp").push(0u64), Arc::clone(&shared));
/// let dp = PrefixStore::new(Key::new("group").push("dp").push(0u64), Arc::clone(&shared));
/// tp.set(&Key::new("addr"), b"10.0.0.1")?;
/// assert_eq!(dp.try_get(&Key::new("addr"))?, None);
/// assert!(shared.try_get(&Key::new("group").push("tp").push(0u64).push("addr"))?.is_some());
/// # Ok::<(), hypercomm_store::StoreError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PrefixStore<S> {
    prefix: Key,
    inner: S,
}

impl<S: Store> PrefixStore<S> {
    /// `inner` seen through `prefix`.
    pub fn new(prefix: Key, inner: S) -> Self {
        PrefixStore { prefix, inner }
    }

    /// The prefix.
    pub fn prefix(&self) -> &Key {
        &self.prefix
    }

    /// The underlying store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn full(&self, key: &Key) -> Key {
        self.prefix.join(key)
    }

    /// Maps keys in an error back into this view, so messages name the keys the caller used.
    fn local_error(&self, err: StoreError) -> StoreError {
        let local = |key: Key| key.strip_prefix(&self.prefix).unwrap_or(key);
        match err {
            StoreError::Timeout { missing, after } => StoreError::Timeout {
                missing: missing.into_iter().map(local).collect(),
                after,
            },
            StoreError::NotACounter { key, value } => StoreError::NotACounter {
                key: local(key),
                value,
            },
            StoreError::CounterOverflow {
                key,
                current,
                delta,
            } => StoreError::CounterOverflow {
                key: local(key),
                current,
                delta,
            },
            other => other,
        }
    }
}

impl<S: Store> Store for PrefixStore<S> {
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
        self.inner
            .set(&self.full(key), value)
            .map_err(|e| self.local_error(e))
    }

    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner
            .try_get(&self.full(key))
            .map_err(|e| self.local_error(e))
    }

    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.inner
            .get(&self.full(key), timeout)
            .map_err(|e| self.local_error(e))
    }

    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
        let full: Vec<Key> = keys.iter().map(|k| self.full(k)).collect();
        self.inner
            .wait(&full, timeout)
            .map_err(|e| self.local_error(e))
    }

    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
        self.inner
            .add(&self.full(key), delta)
            .map_err(|e| self.local_error(e))
    }

    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        self.inner
            .compare_set(&self.full(key), expected, desired)
            .map_err(|e| self.local_error(e))
    }

    fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner
            .delete(&self.full(key))
            .map_err(|e| self.local_error(e))
    }

    /// Counts every key in the underlying store, not only those under the prefix (the store protocol has no
    /// prefix scan; PyTorch's `PrefixStore` behaves the same way).
    fn num_keys(&self) -> Result<u64, StoreError> {
        self.inner.num_keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn prefixes_cannot_blend_into_keys() {
        let shared = Arc::new(MemoryStore::new());
        let a = PrefixStore::new(Key::new("a"), Arc::clone(&shared));
        let ab = PrefixStore::new(Key::new("ab"), Arc::clone(&shared));
        a.set(&Key::new("bc"), b"from a").unwrap();
        ab.set(&Key::new("c"), b"from ab").unwrap();
        assert_eq!(a.try_get(&Key::new("bc")).unwrap().unwrap(), b"from a");
        assert_eq!(ab.try_get(&Key::new("c")).unwrap().unwrap(), b"from ab");
        assert_eq!(shared.num_keys().unwrap(), 2);
    }

    #[test]
    fn timeouts_name_keys_as_the_caller_wrote_them() {
        let store = PrefixStore::new(Key::new("job").push(1u64), MemoryStore::new());
        store.set(&Key::new("here"), b"").unwrap();
        let err = store
            .wait(
                &[Key::new("here"), Key::new("gone")],
                Duration::from_millis(10),
            )
            .unwrap_err();
        match err {
            StoreError::Timeout { missing, .. } => assert_eq!(missing, vec![Key::new("gone")]),
            other => panic!("expected timeout, got {other}"),
        }
    }

    #[test]
    fn every_operation_goes_through_the_prefix() {
        let shared = Arc::new(MemoryStore::new());
        let view = PrefixStore::new(Key::new("p"), Arc::clone(&shared));
        assert_eq!(view.add(&Key::new("n"), 5).unwrap(), 5);
        assert_eq!(
            shared.try_get(&Key::new("p").push("n")).unwrap().unwrap(),
            b"5"
        );
        assert!(
            view.compare_set(&Key::new("c"), None, b"x")
                .unwrap()
                .swapped
        );
        assert_eq!(
            view.get(&Key::new("c"), Duration::from_secs(1)).unwrap(),
            b"x"
        );
        assert!(view.delete(&Key::new("c")).unwrap());
        assert_eq!(shared.try_get(&Key::new("p").push("c")).unwrap(), None);
    }
}
