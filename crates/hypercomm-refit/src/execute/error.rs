//! [`ExecError`]: why a refit could not run, or stopped: a group that does not fit the plan, a buffer of the wrong
//! size, a peer lost mid-refit, a rank of another namespace or epoch.

use std::time::Duration;

use hypercomm_comm::CommError;
use hypercomm_store::StoreError;
use process_group_collection::CollectionError;

use crate::{Peer, RefitError};

/// Why a refit could not run or stopped. Each variant names the offending value and the rule it broke; a lost
/// peer is named by its refit rank ([`ExecError::lost_ranks`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The plan has no such rank.
    #[error("{peer} is not a rank of the plan's {side} layout (ranks {first}..{end})")]
    NotInPlan {
        /// The rank asked for.
        peer: Peer,
        /// `source` or `destination`.
        side: &'static str,
        /// The layout's first rank.
        first: usize,
        /// One past its last rank.
        end: usize,
    },
    /// The communicator does not number the ranks as the plan needs: sources first, then destinations.
    #[error(
        "communicator {comm} has {size} ranks with this one at {rank}, but the plan needs {needed} ranks \
         ({sources} sources, then the destinations) with {peer} at {want}"
    )]
    GroupMismatch {
        /// The communicator's name.
        comm: String,
        /// Its size.
        size: usize,
        /// This rank's rank in it.
        rank: usize,
        /// The ranks the plan needs.
        needed: usize,
        /// Its source ranks.
        sources: usize,
        /// This rank in the plan.
        peer: Peer,
        /// The rank the plan needs it to be.
        want: usize,
    },
    /// A shard buffer whose size is not the plan's.
    #[error(
        "this rank's ({peer}) shard of parameter {name:?} has {have} bytes, but a {side} shard of it has {want}"
    )]
    ShardSize {
        /// This rank in the plan.
        peer: Peer,
        /// The parameter.
        name: String,
        /// `source` or `destination`.
        side: &'static str,
        /// The buffer's size.
        have: u64,
        /// The plan's shard size.
        want: u64,
    },
    /// Shard buffers that could not be read or written (an adapter's own failure, such as a tensor's).
    #[error("the buffers of parameter {name:?}: {why}")]
    Buffers {
        /// The parameter.
        name: String,
        /// What went wrong.
        why: String,
    },
    /// A message larger than this machine's address space.
    #[error("bucket {bucket} needs a {bytes}-byte message, more than this machine can address")]
    TooLarge {
        /// The bucket.
        bucket: usize,
        /// The message's bytes.
        bytes: u64,
    },
    /// A bucket's sends and receives failed: a peer died, stalled or aborted. [`ExecError::lost_ranks`] names the
    /// lost peers by refit rank.
    #[error("bucket {bucket} of the refit: {source}")]
    Comm {
        /// The bucket.
        bucket: usize,
        /// The communicator's error.
        #[source]
        source: Box<CommError>,
    },
    /// A rank joined another namespace or epoch than this one.
    #[error(
        "refit rank {peer} joined namespace {peer_namespace:?} epoch {peer_epoch}, but refit rank {rank} joins \
         namespace {namespace:?} epoch {epoch}"
    )]
    Mismatch {
        /// This rank.
        rank: usize,
        /// Its namespace.
        namespace: String,
        /// Its epoch.
        epoch: u64,
        /// The other rank.
        peer: usize,
        /// The other rank's namespace.
        peer_namespace: String,
        /// The other rank's epoch.
        peer_epoch: u64,
    },
    /// A rank joining an epoch it (or its previous incarnation) has joined already.
    #[error(
        "refit rank {rank} already joined namespace {namespace:?} epoch {previous}: a rank joins each epoch once, \
         so a restarted rank joins a later epoch than {previous}, not {epoch}"
    )]
    StaleEpoch {
        /// The rank.
        rank: usize,
        /// The namespace.
        namespace: String,
        /// The epoch it asked for.
        epoch: u64,
        /// The epoch it joined before.
        previous: u64,
    },
    /// A rank that never announced itself.
    #[error(
        "refit rank {rank} waited {after:?} for refit rank {peer} to join namespace {namespace:?} epoch {epoch}; \
         it never announced itself"
    )]
    Absent {
        /// This rank.
        rank: usize,
        /// The rank waited for.
        peer: usize,
        /// The namespace.
        namespace: String,
        /// The epoch.
        epoch: u64,
        /// How long it waited.
        after: Duration,
    },
    /// A refit group that cannot exist: no ranks, or this rank outside it.
    #[error("refit group {namespace:?}: {why}")]
    BadGroup {
        /// The namespace.
        namespace: String,
        /// What is wrong.
        why: String,
    },
    /// The store failed.
    #[error("refit group {namespace:?} epoch {epoch}: {source}")]
    Store {
        /// The namespace.
        namespace: String,
        /// The epoch.
        epoch: u64,
        /// The store's error.
        #[source]
        source: Box<StoreError>,
    },
    /// Building the refit group's communicator failed.
    #[error(transparent)]
    Collection(Box<CollectionError>),
    /// A plan or sharding error.
    #[error(transparent)]
    Plan(#[from] RefitError),
}

impl From<CollectionError> for ExecError {
    fn from(e: CollectionError) -> Self {
        ExecError::Collection(Box::new(e))
    }
}

impl ExecError {
    /// The ranks lost at the root of this failure (dead or missing), as refit ranks: sources `0..T`, destinations
    /// after them. Empty for failures that lose no rank.
    pub fn lost_ranks(&self) -> &[usize] {
        match self {
            ExecError::Comm { source, .. } => source.lost_ranks(),
            ExecError::Collection(e) => e.lost_ranks(),
            _ => &[],
        }
    }
}
