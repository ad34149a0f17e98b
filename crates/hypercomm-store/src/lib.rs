//! Rendezvous for hypercomm: the key-value store every communicator bootstraps through.
//!
//! Ranks that are about to form a communicator need a place to meet: one rank publishes a bootstrap record (an
//! address, a unique id) and the others read it. This crate provides that place.
//!
//! 1. Build keys with [`Key`]: a key is a list of typed parts, never a concatenated string, so two different
//!    `(name, counter)` pairs can never name the same entry.
//! 2. Talk to a store through the [`Store`] trait: set, get (waiting up to a timeout), wait for several keys,
//!    atomic add, compare-and-set, delete, and count keys.
//! 3. Pick an implementation: [`TcpStore`] for ranks that are processes (a [`TcpStoreServer`] runs in one of them
//!    or standalone; a [`StoreRelay`] per node can stand between them), [`MemoryStore`] for ranks that are
//!    threads of one process (tests, simulations), and [`PrefixStore`] to give independent users of one store
//!    their own key space, and [`CountingStore`] to count what one client costs the store.
//! 4. Find out where this process sits in the job with [`Rendezvous::from_env`] (torchrun, SLURM, Open MPI, MPICH
//!    and `hypercomm launch` are understood). Starting the ranks of a job is the `hypercomm-launch` crate's.
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

mod counting;
mod error;
pub mod frame;
mod key;
mod mac;
mod memory;
mod prefix;
mod rendezvous;
mod secret;
mod store;
mod store_addr;
mod tcp;

pub use counting::{CountingStore, StoreCounts};
pub use error::StoreError;
pub use key::{Key, KeyDecodeError, KeyPart};
pub use memory::MemoryStore;
pub use prefix::PrefixStore;
pub use rendezvous::{
    COMM_TIMEOUT_ENV, EnvSource, Joined, Rendezvous, RendezvousError, STORE_ADDR_ENV,
};
pub use secret::{SECRET_ENV, Secret, SecretError};
pub use store::{CompareSet, Store};
pub use store_addr::StoreAddr;
pub use tcp::{
    ClientOptions, RELAY_ADDR_ENV, RelayError, ServerError, ServerOptions, StoreRelay, TcpStore,
    TcpStoreServer,
};
