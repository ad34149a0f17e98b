//! [`MemoryStore`]: a store inside one process, for ranks that are threads (tests, simulations).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::{checked_counter_add, parse_counter};
use crate::{CompareSet, Key, Store, StoreError};

/// A store held in this process's memory. Clone an `Arc<MemoryStore>` to share it between threads.
///
/// It is a value like any other: two `MemoryStore`s never see each other's keys.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<Key, Vec<u8>>>,
    changed: Condvar,
    /// Set once by [`MemoryStore::close`]; waiters check it under the map lock, so none sleeps through it.
    closed: std::sync::atomic::AtomicBool,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every waiter and makes current and future waits fail with [`StoreError::Closed`]. Operations that
    /// do not wait keep working. A server calls this when it shuts down, so no connection thread outlives it.
    pub fn close(&self) {
        let _guard = self.lock();
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Vec<u8>>> {
        // A panic while holding this lock cannot leave the map half-updated: every critical section below is a
        // single HashMap call. Recover the guard instead of propagating the poison.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until `ready` holds for the map or `timeout` passes; returns the guard either way.
    fn wait_until<'a>(
        &'a self,
        mut map: MutexGuard<'a, HashMap<Key, Vec<u8>>>,
        timeout: Duration,
        ready: impl Fn(&HashMap<Key, Vec<u8>>) -> bool,
    ) -> (MutexGuard<'a, HashMap<Key, Vec<u8>>>, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(&map) {
                return (map, true);
            }
            let now = Instant::now();
            if now >= deadline || self.is_closed() {
                return (map, false);
            }
            map = self
                .changed
                .wait_timeout(map, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &Key, value: &[u8]) -> Result<(), StoreError> {
        self.lock().insert(key.clone(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn try_get(&self, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }

    fn get(&self, key: &Key, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let (map, _) = self.wait_until(self.lock(), timeout, |m| m.contains_key(key));
        match map.get(key) {
            Some(value) => Ok(value.clone()),
            None if self.is_closed() => Err(StoreError::Closed),
            None => Err(StoreError::Timeout {
                missing: vec![key.clone()],
                after: timeout,
            }),
        }
    }

    fn wait(&self, keys: &[Key], timeout: Duration) -> Result<(), StoreError> {
        let (map, ok) = self.wait_until(self.lock(), timeout, |m| {
            keys.iter().all(|k| m.contains_key(k))
        });
        if ok {
            return Ok(());
        }
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        Err(StoreError::Timeout {
            missing: keys
                .iter()
                .filter(|k| !map.contains_key(k))
                .cloned()
                .collect(),
            after: timeout,
        })
    }

    fn add(&self, key: &Key, delta: i64) -> Result<i64, StoreError> {
        let mut map = self.lock();
        let current = parse_counter(key, map.get(key).map(Vec::as_slice))?;
        let next = checked_counter_add(key, current, delta)?;
        map.insert(key.clone(), next.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(next)
    }

    fn compare_set(
        &self,
        key: &Key,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        let mut map = self.lock();
        let swapped = map.get(key).map(Vec::as_slice) == expected;
        if swapped {
            map.insert(key.clone(), desired.to_vec());
        }
        let current = map.get(key).cloned();
        drop(map);
        if swapped {
            self.changed.notify_all();
        }
        Ok(CompareSet { swapped, current })
    }

    fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        Ok(self.lock().remove(key).is_some())
    }

    fn num_keys(&self) -> Result<u64, StoreError> {
        Ok(self.lock().len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn get_waits_for_a_later_set() {
        let store = Arc::new(MemoryStore::new());
        let key = Key::new("late");
        let writer = {
            let store = Arc::clone(&store);
            let key = key.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                store.set(&key, b"v").unwrap();
            })
        };
        assert_eq!(store.get(&key, LONG).unwrap(), b"v");
        writer.join().unwrap();
    }

    #[test]
    fn wait_times_out_naming_only_missing_keys() {
        let store = MemoryStore::new();
        store.set(&Key::new("a"), b"1").unwrap();
        let err = store
            .wait(&[Key::new("a"), Key::new("b")], SHORT)
            .unwrap_err();
        match err {
            StoreError::Timeout { missing, .. } => assert_eq!(missing, vec![Key::new("b")]),
            other => panic!("expected timeout, got {other}"),
        }
    }

    #[test]
    fn add_counts_from_many_threads() {
        let store = Arc::new(MemoryStore::new());
        let key = Key::new("counter");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let store = Arc::clone(&store);
                let key = key.clone();
                thread::spawn(move || {
                    for _ in 0..100 {
                        store.add(&key, 1).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.add(&key, 0).unwrap(), 800);
    }

    #[test]
    fn add_rejects_non_counters_and_overflow() {
        let store = MemoryStore::new();
        store.set(&Key::new("text"), b"abc").unwrap();
        assert!(matches!(
            store.add(&Key::new("text"), 1),
            Err(StoreError::NotACounter { .. })
        ));
        store.add(&Key::new("big"), i64::MAX).unwrap();
        let err = store.add(&Key::new("big"), 1).unwrap_err();
        assert!(err.to_string().contains("overflows"), "{err}");
    }

    #[test]
    fn compare_set_swaps_only_on_match() {
        let store = MemoryStore::new();
        let key = Key::new("leader");
        let first = store.compare_set(&key, None, b"rank0").unwrap();
        assert!(first.swapped);
        let second = store.compare_set(&key, None, b"rank1").unwrap();
        assert!(!second.swapped);
        assert_eq!(second.current.as_deref(), Some(&b"rank0"[..]));
        let third = store.compare_set(&key, Some(b"rank0"), b"rank2").unwrap();
        assert!(third.swapped);
        assert_eq!(store.try_get(&key).unwrap().as_deref(), Some(&b"rank2"[..]));
    }

    #[test]
    fn delete_and_count() {
        let store = MemoryStore::new();
        store.set(&Key::new("a"), b"").unwrap();
        store.set(&Key::new("b"), b"").unwrap();
        assert_eq!(store.num_keys().unwrap(), 2);
        assert!(store.delete(&Key::new("a")).unwrap());
        assert!(!store.delete(&Key::new("a")).unwrap());
        assert_eq!(store.num_keys().unwrap(), 1);
    }

    #[test]
    fn close_wakes_waiters_with_an_error() {
        let store = Arc::new(MemoryStore::new());
        let waiter = {
            let store = Arc::clone(&store);
            thread::spawn(move || store.get(&Key::new("never"), Duration::from_secs(600)))
        };
        // Closing is sticky: whether the waiter is already asleep or not yet waiting, it returns at once.
        store.close();
        assert!(matches!(waiter.join().unwrap(), Err(StoreError::Closed)));
        store.set(&Key::new("k"), b"v").unwrap();
        assert_eq!(store.get(&Key::new("k"), SHORT).unwrap(), b"v");
    }

    #[test]
    fn two_stores_are_independent() {
        let a = MemoryStore::new();
        let b = MemoryStore::new();
        a.set(&Key::new("k"), b"1").unwrap();
        assert_eq!(b.try_get(&Key::new("k")).unwrap(), None);
    }
}
