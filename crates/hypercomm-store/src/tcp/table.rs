//! The server's key-value table and the requests parked on it.
//!
//! Values live in one map. A `get` or `wait` that cannot be answered yet costs a [`Waiter`] entry in a second
//! map, under the one key it is waiting for now, instead of a thread: writing that key hands its waiters back to
//! the event loop, which re-checks each request and either answers it or parks it under its next missing key.
//! Only the event loop's thread touches a table, so nothing here locks.

use std::collections::HashMap;

use crate::store::{checked_counter_add, parse_counter};
use crate::{CompareSet, Key, StoreError};

/// One parked request: the connection (its event-loop token) and which of its requests (a sequence number, so a
/// stale entry for an earlier request on the same connection is recognised and ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiter {
    /// The connection's token.
    pub conn: usize,
    /// The request's sequence number, unique within the server.
    pub seq: u64,
}

/// Every value, and for each missing key the requests waiting for it.
#[derive(Debug, Default)]
pub(super) struct Table {
    values: HashMap<Key, Vec<u8>>,
    waiters: HashMap<Key, Vec<Waiter>>,
    /// How many deletes have happened: a parked `wait` that saw a key earlier re-checks it only if this moved.
    deletes: u64,
    /// Waiters registered now, over all keys.
    parked: usize,
}

impl Table {
    /// The value under `key`.
    pub fn get(&self, key: &Key) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    /// Writes `value` under `key` and appends the requests waiting for `key` to `woken`.
    pub fn set(&mut self, key: Key, value: Vec<u8>, woken: &mut Vec<Waiter>) {
        self.wake(&key, woken);
        self.values.insert(key, value);
    }

    /// Adds `delta` to the decimal counter under `key` (absent counts as 0), waking its waiters.
    pub fn add(
        &mut self,
        key: Key,
        delta: i64,
        woken: &mut Vec<Waiter>,
    ) -> Result<i64, StoreError> {
        let current = parse_counter(&key, self.get(&key))?;
        let next = checked_counter_add(&key, current, delta)?;
        self.set(key, next.to_string().into_bytes(), woken);
        Ok(next)
    }

    /// Writes `desired` if the value now equals `expected` (`None`: absent), waking the key's waiters if it did.
    pub fn compare_set(
        &mut self,
        key: Key,
        expected: Option<&[u8]>,
        desired: Vec<u8>,
        woken: &mut Vec<Waiter>,
    ) -> CompareSet {
        if self.get(&key) == expected {
            self.set(key, desired.clone(), woken);
            CompareSet {
                swapped: true,
                current: Some(desired),
            }
        } else {
            CompareSet {
                swapped: false,
                current: self.get(&key).map(<[u8]>::to_vec),
            }
        }
    }

    /// Removes `key`; returns whether it existed.
    pub fn delete(&mut self, key: &Key) -> bool {
        let existed = self.values.remove(key).is_some();
        if existed {
            self.deletes += 1;
        }
        existed
    }

    /// How many keys the table holds.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// How many deletes have happened so far.
    pub fn deletes(&self) -> u64 {
        self.deletes
    }

    /// The index of the first key of `keys[from..]` that is absent, if any.
    pub fn first_missing(&self, keys: &[Key], from: usize) -> Option<usize> {
        keys.iter()
            .enumerate()
            .skip(from)
            .find(|(_, key)| !self.values.contains_key(key))
            .map(|(i, _)| i)
    }

    /// Registers `waiter` to be woken when `key` is written.
    pub fn park(&mut self, key: &Key, waiter: Waiter) {
        match self.waiters.get_mut(key) {
            Some(list) => list.push(waiter),
            None => {
                self.waiters.insert(key.clone(), vec![waiter]);
            }
        }
        self.parked += 1;
    }

    /// Withdraws `waiter` from `key` (it timed out, or its connection closed).
    pub fn unpark(&mut self, key: &Key, waiter: Waiter) {
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        if let Some(at) = list.iter().position(|w| *w == waiter) {
            list.swap_remove(at);
            self.parked -= 1;
        }
        if list.is_empty() {
            self.waiters.remove(key);
        }
    }

    /// How many requests are parked now.
    pub fn parked(&self) -> usize {
        self.parked
    }

    fn wake(&mut self, key: &Key, woken: &mut Vec<Waiter>) {
        if let Some(list) = self.waiters.remove(key) {
            self.parked -= list.len();
            woken.extend(list);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(conn: usize, seq: u64) -> Waiter {
        Waiter { conn, seq }
    }

    #[test]
    fn writing_a_key_wakes_exactly_its_waiters() {
        let mut table = Table::default();
        table.park(&Key::new("a"), w(2, 1));
        table.park(&Key::new("a"), w(3, 2));
        table.park(&Key::new("b"), w(4, 3));
        let mut woken = Vec::new();
        table.set(Key::new("a"), b"1".to_vec(), &mut woken);
        assert_eq!(woken, vec![w(2, 1), w(3, 2)]);
        assert_eq!(table.parked(), 1);
        woken.clear();
        assert_eq!(table.add(Key::new("b"), 5, &mut woken).unwrap(), 5);
        assert_eq!(woken, vec![w(4, 3)]);
        assert_eq!(table.parked(), 0);
    }

    #[test]
    fn unpark_forgets_the_waiter_and_the_empty_list() {
        let mut table = Table::default();
        table.park(&Key::new("a"), w(2, 1));
        table.unpark(&Key::new("a"), w(2, 1));
        table.unpark(&Key::new("a"), w(2, 1));
        assert_eq!(table.parked(), 0);
        assert!(table.waiters.is_empty());
        let mut woken = Vec::new();
        table.set(Key::new("a"), Vec::new(), &mut woken);
        assert!(woken.is_empty());
    }

    #[test]
    fn compare_set_wakes_only_when_it_swaps() {
        let mut table = Table::default();
        table.park(&Key::new("k"), w(2, 1));
        let mut woken = Vec::new();
        let missed = table.compare_set(Key::new("k"), Some(b"x"), b"y".to_vec(), &mut woken);
        assert!(!missed.swapped && missed.current.is_none() && woken.is_empty());
        let hit = table.compare_set(Key::new("k"), None, b"y".to_vec(), &mut woken);
        assert!(hit.swapped);
        assert_eq!(woken, vec![w(2, 1)]);
    }

    #[test]
    fn first_missing_and_deletes() {
        let mut table = Table::default();
        let keys: Vec<Key> = (0..4u64).map(|i| Key::new("k").push(i)).collect();
        let mut woken = Vec::new();
        table.set(keys[0].clone(), Vec::new(), &mut woken);
        table.set(keys[2].clone(), Vec::new(), &mut woken);
        assert_eq!(table.first_missing(&keys, 0), Some(1));
        assert_eq!(table.first_missing(&keys, 2), Some(3));
        assert_eq!(table.first_missing(&keys[..1], 0), None);
        assert!(table.delete(&keys[0]));
        assert!(!table.delete(&keys[0]));
        assert_eq!(table.deletes(), 1);
        assert_eq!(table.len(), 1);
    }
}
