//! [`Ledger`]: a store seen through a list of the keys this rank writes, so that the refit group can delete its
//! bootstrap records once every rank has read them, and a refit that is set up again and again leaves nothing
//! behind.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hypercomm_store::{CompareSet, Key, Store, StoreError};

/// `inner`, recording every key written through it (set, add, compare-and-set) until [`Ledger::forget`].
#[derive(Debug)]
pub(crate) struct Ledger {
    inner: Arc<dyn Store>,
    written: Mutex<Vec<Key>>,
}

impl Ledger {
    pub(crate) fn new(inner: Arc<dyn Store>) -> Ledger {
        Ledger {
            inner,
            written: Mutex::new(Vec::new()),
        }
    }

    fn note(&self, key: &Key) {
        // A poisoned list is still a list of keys: a panic elsewhere does not make it wrong.
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if !written.contains(key) {
            written.push(key.clone());
        }
    }

    /// Deletes every key written so far and forgets them.
    pub(crate) fn delete_written(&self) -> Result<(), StoreError> {
        let keys =
            std::mem::take(&mut *self.written.lock().unwrap_or_else(PoisonError::into_inner));
        for key in &keys {
            self.inner.delete(key)?;
        }
        Ok(())
    }
}

impl Store for Ledger {
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
        self.note(key);
        self.inner.set(key, value)
    }

    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.try_get(key)
    }

    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key, timeout)
    }

    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
        self.inner.wait(keys, timeout)
    }

    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
        self.note(key);
        self.inner.add(key, delta)
    }

    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        self.note(key);
        self.inner.compare_set(key, expected, desired)
    }

    fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner.delete(key)
    }

    fn num_keys(&self) -> Result<u64, StoreError> {
        self.inner.num_keys()
    }
}

#[cfg(test)]
mod tests {
    use hypercomm_store::MemoryStore;

    use super::*;

    #[test]
    fn deletes_what_it_wrote_and_nothing_else() {
        let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
        shared.set(&Key::new("theirs"), b"x").unwrap();
        let ledger = Ledger::new(Arc::clone(&shared));
        ledger.set(&Key::new("a"), b"1").unwrap();
        ledger.add(&Key::new("b"), 2).unwrap();
        ledger.compare_set(&Key::new("c"), None, b"3").unwrap();
        ledger.set(&Key::new("a"), b"again").unwrap();
        assert_eq!(shared.num_keys().unwrap(), 4);
        ledger.delete_written().unwrap();
        assert_eq!(shared.num_keys().unwrap(), 1);
        assert!(shared.try_get(&Key::new("theirs")).unwrap().is_some());
        // Forgotten: a second call deletes nothing more.
        ledger.delete_written().unwrap();
        assert_eq!(shared.num_keys().unwrap(), 1);
    }
}
