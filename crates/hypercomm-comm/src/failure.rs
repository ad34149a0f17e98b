//! How the news of a lost rank reaches every member of a communicator.
//!
//! When a rank sees a peer die or stall, it aborts the communicator so that the others stop waiting at once. An
//! abort alone would tell them only *who aborted*, not *which rank was lost*. So before aborting, the rank writes
//! the ranks it lost to the store under `comm/<name>/failure/<rank>`, and a rank stopped by that abort reads the
//! key (briefly) and names the lost ranks in its own error. A rank that aborts because a peer aborted passes the
//! list on under its own key, so chains of aborts keep the original cause.
//!
//! The write runs on a short-lived thread that the aborting rank waits for at most [`PUBLISH_WAIT`] (a store that
//! is itself gone must not hold the abort up for long), and the readers wait at most [`FETCH_WAIT`] for it.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_store::{Key, Store};

use crate::CommError;

/// How long a failing rank waits for its failure record to reach the store before aborting anyway.
pub(crate) const PUBLISH_WAIT: Duration = Duration::from_millis(500);

/// How long a rank stopped by a peer's abort waits for that peer's failure record.
pub(crate) const FETCH_WAIT: Duration = Duration::from_millis(1500);

fn key(comm: &str, rank: usize) -> Key {
    Key::new("comm").push(comm).push("failure").push(rank)
}

/// The ranks an error says were lost: dead or missing peers, or the ranks a peer's abort reported.
pub(crate) fn lost_ranks(e: &CommError) -> Option<&[usize]> {
    match e {
        CommError::Timeout { missing, .. } => Some(missing),
        CommError::PeerDied { ranks, .. } => Some(ranks),
        CommError::AbortedByPeer { lost, .. } => Some(lost),
        _ => None,
    }
}

fn encode(lost: &[usize]) -> Vec<u8> {
    lost.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

fn decode(bytes: &[u8], size: usize) -> Vec<usize> {
    String::from_utf8_lossy(bytes)
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
        .filter(|&r| r < size)
        .collect()
}

/// Records that `rank` of `comm` lost `lost` (an empty list means a deliberate abort), waiting at most
/// [`PUBLISH_WAIT`] for the store: long enough for a live store, short enough that a dead one barely delays the
/// abort. The write goes on in the background past that, in case the process lives on.
pub(crate) fn publish(store: &Arc<dyn Store>, comm: &str, rank: usize, lost: &[usize]) {
    let (store, key, value) = (Arc::clone(store), key(comm, rank), encode(lost));
    let (done, written) = std::sync::mpsc::channel();
    // A failure to start the thread or to write only costs the peers the detail; they still fail.
    let spawned = std::thread::Builder::new()
        .name("hypercomm-failure".into())
        .spawn(move || {
            let _ = store.set(&key, &value);
            let _ = done.send(());
        });
    if spawned.is_ok() {
        // Waiting matters: a process that exits right after its error would otherwise kill the write.
        let _ = written.recv_timeout(PUBLISH_WAIT);
    }
}

/// The ranks `by` reported lost before aborting `comm` (of `size` ranks); empty when it reported none in time.
pub(crate) fn fetch(store: &dyn Store, comm: &str, by: usize, size: usize) -> Vec<usize> {
    store
        .get(&key(comm, by), FETCH_WAIT)
        .map(|v| decode(&v, size))
        .unwrap_or_default()
}

/// How long a rank that saw peers vanish waits, in all, for their failure records (see [`messenger`]).
pub(crate) const MESSENGER_WAIT: Duration = Duration::from_millis(1000);

/// Of `gone`, the ranks of `comm` (of `size` ranks) whose processes or connections just vanished, the first that
/// had published a failure record, with the ranks that record names: that peer did not die of its own accord, it
/// aborted (and exited) because it lost those ranks, and publishes its record before it aborts. A rank that was
/// itself killed publishes nothing. Waits at most [`MESSENGER_WAIT`] in all.
pub(crate) fn messenger(
    store: &dyn Store,
    comm: &str,
    gone: &[usize],
    size: usize,
) -> Option<(usize, Vec<usize>)> {
    let deadline = std::time::Instant::now() + MESSENGER_WAIT;
    for &peer in gone {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Each later peer still gets a moment: its record may have landed while we waited for an earlier one.
        let wait = left.max(Duration::from_millis(20));
        if let Ok(record) = store.get(&key(comm, peer), wait) {
            let lost = decode(&record, size);
            if !lost.is_empty() {
                return Some((peer, lost));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_store::MemoryStore;

    #[test]
    fn a_published_list_is_fetched_and_junk_is_dropped() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        publish(&store, "c", 1, &[2, 5]);
        assert_eq!(fetch(store.as_ref(), "c", 1, 8), vec![2, 5]);
        // Out-of-range and malformed entries never become rank numbers.
        store.set(&key("c", 3), b"1,x,99,,4").unwrap();
        assert_eq!(fetch(store.as_ref(), "c", 3, 8), vec![1, 4]);
        // Nothing published: empty, after the bounded wait.
        assert_eq!(fetch(store.as_ref(), "c", 0, 8), Vec::<usize>::new());
    }

    #[test]
    fn a_vanished_peer_with_a_record_was_the_messenger() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // Rank 0 lost rank 3, published that, aborted and exited; rank 1 was killed and published nothing.
        publish(&store, "c", 0, &[3]);
        assert_eq!(
            messenger(store.as_ref(), "c", &[1, 0], 4),
            Some((0, vec![3]))
        );
        assert_eq!(
            messenger(store.as_ref(), "c", &[1], 4),
            None,
            "a killed rank leaves no record"
        );
        // A deliberate abort (an empty record) names no culprit.
        publish(&store, "c", 2, &[]);
        assert_eq!(messenger(store.as_ref(), "c", &[2], 4), None);
    }
}
