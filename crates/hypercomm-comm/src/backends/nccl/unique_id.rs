//! Sharing an `ncclUniqueId` through the store: rank 0 makes it and writes it under a structured key, the other
//! ranks read it.
//!
//! The key is `comm/<name>/nccl/unique-id`, beside the host backend's keys of the same communicator, so one
//! communicator name never collides with another's id and the store's own timeout bounds every wait.

use std::time::Duration;

use hypercomm_store::{Key, Store};

use crate::CommError;

/// Bytes in an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`).
pub(crate) const UNIQUE_ID_BYTES: usize = nccl_sys::sys::NCCL_UNIQUE_ID_BYTES as usize;

/// The store key under which communicator `name`'s unique id is published.
pub(crate) fn unique_id_key(name: &str) -> Key {
    Key::new("comm").push(name).push("nccl").push("unique-id")
}

/// Rank 0 calls `make` and publishes its bytes; every other rank waits up to `timeout` for them. Every rank gets
/// the same 128 bytes or an error naming the communicator.
pub(crate) fn exchange_unique_id(
    store: &dyn Store,
    name: &str,
    rank: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<[u8; UNIQUE_ID_BYTES], CommError>,
) -> Result<[u8; UNIQUE_ID_BYTES], CommError> {
    let key = unique_id_key(name);
    let store_err = |source| CommError::Store {
        comm: name.to_owned(),
        source,
    };
    if rank == 0 {
        let id = make()?;
        store.set(&key, &id).map_err(store_err)?;
        return Ok(id);
    }
    let bytes = store.get(&key, timeout).map_err(store_err)?;
    <[u8; UNIQUE_ID_BYTES]>::try_from(bytes.as_slice()).map_err(|_| CommError::Protocol {
        comm: name.to_owned(),
        what: format!(
            "the nccl unique id under {key:?} has {} bytes, expected {UNIQUE_ID_BYTES}",
            bytes.len()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_store::MemoryStore;
    use std::sync::Arc;

    #[test]
    fn every_rank_reads_what_rank_zero_made() {
        let store = Arc::new(MemoryStore::new());
        let ids: Vec<_> = (0..4)
            .map(|rank| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    exchange_unique_id(store.as_ref(), "tp", rank, Duration::from_secs(30), || {
                        assert_eq!(rank, 0, "only rank 0 makes the id");
                        let mut id = [0u8; UNIQUE_ID_BYTES];
                        id.iter_mut()
                            .enumerate()
                            .for_each(|(i, b)| *b = i as u8 ^ 0x5a);
                        Ok(id)
                    })
                })
            })
            .collect();
        let ids: Vec<_> = ids
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect();
        assert!(ids.iter().all(|id| id == &ids[0]));
        assert_eq!(ids[0][3], 3 ^ 0x5a);
        // Structured key, readable by name.
        assert_eq!(
            store.try_get(&unique_id_key("tp")).unwrap().unwrap(),
            ids[0].to_vec()
        );
    }

    #[test]
    fn names_do_not_collide_and_a_missing_id_times_out_naming_the_communicator() {
        let store = MemoryStore::new();
        exchange_unique_id(&store, "a", 0, Duration::from_secs(1), || {
            Ok([1; UNIQUE_ID_BYTES])
        })
        .unwrap();
        let err = exchange_unique_id(&store, "b", 1, Duration::from_millis(50), || {
            unreachable!("rank 1 never makes the id")
        })
        .unwrap_err();
        assert!(
            matches!(&err, CommError::Store { comm, .. } if comm == "b"),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_length_is_a_protocol_error() {
        let store = MemoryStore::new();
        store.set(&unique_id_key("c"), &[0u8; 7]).unwrap();
        let err = exchange_unique_id(&store, "c", 2, Duration::from_secs(1), || unreachable!())
            .unwrap_err()
            .to_string();
        assert!(err.contains("has 7 bytes, expected 128"), "{err}");
    }
}
