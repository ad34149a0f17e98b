//! Ranks as threads sharing one in-process store.

#![allow(dead_code)]

use std::sync::Arc;

use hypercomm_store::{MemoryStore, Store};

/// Runs `f(rank, store)` on `ranks` threads sharing one `MemoryStore`; returns each rank's result in rank order.
/// A panic or error on any rank fails the test with that rank named.
pub fn run_ranks<T: Send + 'static>(
    ranks: impl IntoIterator<Item = usize>,
    f: impl Fn(usize, Arc<dyn Store>) -> Result<T, String> + Send + Sync + 'static,
) -> Vec<T> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let f = Arc::new(f);
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|rank| {
            let (store, f) = (Arc::clone(&store), Arc::clone(&f));
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || (rank, f(rank, store)))
                .expect("spawn rank thread")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| match h.join() {
            Ok((_, Ok(value))) => value,
            Ok((rank, Err(e))) => panic!("rank {rank}: {e}"),
            Err(_) => panic!("a rank thread panicked"),
        })
        .collect()
}
