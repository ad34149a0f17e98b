//! [`CollectionError`]: why a collection could not be built, or a group not handed out.

use hypercomm_comm::CommError;
use hypercomm_grid::layout::LayoutError;

use crate::group_id::GroupId;

/// What went wrong building or using a [`ProcessGroupCollection`](crate::ProcessGroupCollection).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectionError {
    /// The layout has no such group kind, or rejected the rank.
    #[error("collection {collection}: {source}")]
    Layout {
        /// The collection's name.
        collection: String,
        /// The layout's error.
        source: LayoutError,
    },
    /// The collection was built without the group asked for.
    #[error("collection {collection} has no {group} group: {why}")]
    Absent {
        /// The collection's name.
        collection: String,
        /// The group asked for.
        group: GroupId,
        /// Why it is absent.
        why: String,
    },
    /// This rank belongs to no group of the kind asked for.
    #[error("collection {collection}: rank {rank} is in no {group} group: {why}")]
    NotMember {
        /// The collection's name.
        collection: String,
        /// This rank.
        rank: usize,
        /// The group asked for.
        group: GroupId,
        /// Why the rank is left out.
        why: &'static str,
    },
    /// Creating or using a group's communicator failed.
    #[error("collection {collection}, group {group}: {source}")]
    Comm {
        /// The collection's name.
        collection: String,
        /// The group.
        group: GroupId,
        /// The communicator's error.
        source: Box<CommError>,
    },
    /// The per-group options are invalid.
    #[error("group options: {0}")]
    Options(String),
    /// The build request is inconsistent.
    #[error("collection {collection}: {what}")]
    Invalid {
        /// The collection's name.
        collection: String,
        /// What is wrong.
        what: String,
    },
    /// A layout cannot shrink around the lost ranks.
    #[error("cannot rebuild without the lost ranks: {0}")]
    Rebuild(String),
}

impl CollectionError {
    /// The communicator error behind this one, if a communicator failed.
    pub fn comm_error(&self) -> Option<&CommError> {
        match self {
            CollectionError::Comm { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The world ranks lost (dead or missing) at the root of this failure: [`CommError::lost_ranks`] of the
    /// communicator error; empty for every other error. Ready for
    /// [`ShrunkLayout::without_replicas_of`](crate::ShrunkLayout::without_replicas_of), as a communicator's own
    /// errors are:
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use hypercomm_comm::ReduceOp;
    /// use hypercomm_grid::layout::LayoutConfig;
    /// use process_group_collection::{ProcessGroupCollection, ShrunkLayout};
    /// # let store: Arc<dyn hypercomm_store::Store> = Arc::new(hypercomm_store::MemoryStore::new());
    /// # let rank = 0;
    ///
    /// let layout = LayoutConfig::new(4).tp(2).build()?;
    /// let pgc = ProcessGroupCollection::for_layout("model", layout.clone()).build(rank, store)?;
    /// if let Err(e) = pgc.dp()?.all_reduce(vec![1.0f32; 1024], ReduceOp::Sum)?.wait() {
    ///     // World ranks, whichever group met the failure first.
    ///     let shrunk = ShrunkLayout::without_replicas_of(&layout, e.lost_ranks())?;
    ///     println!("rank {rank} goes on as {:?}", shrunk.new_rank(rank));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lost_ranks(&self) -> &[usize] {
        self.comm_error().map_or(&[], CommError::lost_ranks)
    }

    /// The world ranks to blame: [`CommError::culprits`] of the communicator error (lost ranks, or ranks whose
    /// arguments disagreed); empty for every other error.
    pub fn culprits(&self) -> &[usize] {
        self.comm_error().map_or(&[], CommError::culprits)
    }
}
