//! Rendezvous for hypercomm: the key-value store every communicator bootstraps through.
//!
//! Ranks that are about to form a communicator need a place to meet: one rank publishes a bootstrap record (an
//! address, a unique id) and the others read it. This crate provides that place.
//!
//! 1. Build keys with [`Key`]: a key is a list of typed parts, never a concatenated string, so two different
//!    `(name, counter)` pairs can never name the same entry.
//! 2. Talk to a store through the [`Store`] trait: set, get (waiting up to a timeout), wait for several keys,
//!    atomic add, compare-and-set, delete, and count keys.
//! 3. Pick an implementation: [`MemoryStore`] for ranks that are threads of one process (tests, simulations).
//!
//! ```
//! use std::time::Duration;
//! use hypercomm_store::{Key, MemoryStore, Store};
//!
//! let store = MemoryStore::new();
//! let key = Key::new("collection").push("policy").push(3u64);
//! store.set(&key, b"hello")?;
//! assert_eq!(store.get(&key, Duration::from_secs(1))?, b"hello");
//! assert_eq!(store.add(&Key::new("arrivals"), 1)?, 1);
//! # Ok::<(), hypercomm_store::StoreError>(())
//! ```

mod error;
mod key;
mod memory;
mod store;

pub use error::StoreError;
pub use key::{Key, KeyDecodeError, KeyPart};
pub use memory::MemoryStore;
pub use store::{CompareSet, Store};
