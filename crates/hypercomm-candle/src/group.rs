//! [`TensorGroup`]: one process group of a collection, as the tensor collectives, the gradient synchroniser and
//! the tensor-parallel layers see it.
//!
//! A group is a shared handle (`Arc` inside, cheap to clone) so that candle custom ops, which must be `'static`,
//! can hold it. It names its communicator by [`GroupId`] in a [`ProcessGroupCollection`] rather than borrowing it,
//! so a lazy collection creates the communicator on first use, or wraps a standalone [`Communicator`].

use std::sync::Arc;

use hypercomm_comm::Communicator;
use process_group_collection::{GroupId, ProcessGroupCollection};

use crate::{Error, Result};

#[derive(Debug, Clone)]
enum Source {
    Collection {
        collection: Arc<ProcessGroupCollection>,
        id: GroupId,
    },
    Communicator(Arc<Communicator>),
}

/// A process group that tensors move through: a group of a [`ProcessGroupCollection`], or a standalone
/// [`Communicator`].
///
/// Every collective on a group is collective: all its ranks must issue the same operations in the same order.
#[derive(Debug, Clone)]
pub struct TensorGroup {
    source: Source,
    name: String,
    rank: usize,
    size: usize,
}

impl TensorGroup {
    /// The group `id` of `collection`. Fails when this rank is not a member or the collection lacks the group;
    /// a lazy collection creates the communicator now.
    pub fn new(collection: Arc<ProcessGroupCollection>, id: GroupId) -> Result<TensorGroup> {
        let comm = collection.get(&id)?;
        let (name, rank, size) = (comm.name().to_owned(), comm.rank(), comm.size());
        Ok(TensorGroup {
            source: Source::Collection { collection, id },
            name,
            rank,
            size,
        })
    }

    /// The primary group of a layout kind (`"tp"`, `"dp"`, `"dp_cp"`, ...) of `collection`.
    pub fn kind(collection: &Arc<ProcessGroupCollection>, kind: &str) -> Result<TensorGroup> {
        TensorGroup::new(Arc::clone(collection), GroupId::kind(kind))
    }

    /// A group over a standalone communicator.
    pub fn from_communicator(comm: Arc<Communicator>) -> TensorGroup {
        TensorGroup {
            name: comm.name().to_owned(),
            rank: comm.rank(),
            size: comm.size(),
            source: Source::Communicator(comm),
        }
    }

    /// The communicator tensors go through: CPU tensors as host vectors, CUDA tensors as device buffers when it
    /// has a GPU (a collection built `with_gpu`).
    pub fn comm(&self) -> Result<&Communicator> {
        match &self.source {
            Source::Collection { collection, id } => Ok(collection.get(id)?),
            Source::Communicator(comm) => Ok(comm),
        }
    }

    /// The communicator's name (used in error messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This rank's rank within the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// An [`Error::Argument`] of `op` on this group: `what` names the offending value and the rule it broke.
    pub(crate) fn argument_error(&self, op: &'static str, what: String) -> Error {
        Error::Argument {
            op,
            group: self.name.clone(),
            what,
        }
    }
}
