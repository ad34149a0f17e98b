//! Per rank, the communicators of every group it belongs to: Megatron-Core's `ProcessGroupCollection`, built
//! without global state and without any rank enumerating the world.
//!
//! 1. Describe the groups: a [`ParallelLayout`](hypercomm_grid::layout::ParallelLayout) through
//!    [`ProcessGroupCollection::for_layout`], and/or custom kinds (grid groups, explicit rank lists) through
//!    [`ProcessGroupCollection::custom`].
//! 2. Choose what to build: all-gather twins ([`CollectionBuilder::with_all_gather_groups`]), further tagged
//!    communicators over the same ranks ([`CollectionBuilder::with_tagged`]), per-kind [`GroupOptions`] (from code
//!    or a JSON file), eager or lazy [`Creation`].
//! 3. Build on each rank, either store-keyed ([`CollectionBuilder::build`]: each rank meets only its groups'
//!    members, under `collection/<name>/<kind>/<level>/<group>/<tag>`) or by splitting a parent communicator
//!    ([`CollectionBuilder::build_by_split`]: one split per group slot).
//! 4. Use the communicators through typed accessors (`tp()`, `dp_cp()`, `dp_cp_ag()`, `hcp(level)`, ...) or
//!    [`ProcessGroupCollection::get`]. Asking for a group the collection lacks says why.
//! 5. On a failure, every communicator of the collection on this rank is aborted and the root cause recorded in the
//!    collection's failure domain, so every rank, whichever group it meets the failure in, names the same culprit
//!    by world rank ([`CommError::lost_ranks`](hypercomm_comm::CommError::lost_ranks),
//!    [`CollectionError::lost_ranks`]). After losing ranks, [`ShrunkLayout::without_replicas_of`] drops the
//!    data-parallel replicas that held them and says where every surviving rank lands in the smaller layout; build
//!    a new collection over it.
//!
//! Each rank computes only its own groups with `group_of`, and its bootstrap costs the store a constant number of
//! requests per group, so its work grows with the number of groups it is in, not with the world ([`cost`]
//! simulates the store traffic for worlds of any size). Dropping a collection releases every communicator.

mod builder;
mod closing;
mod collection;
pub mod cost;
mod error;
mod group_id;
mod options;
mod plan;
mod rebuild;
mod steps;

pub use builder::{CollectionBuilder, Creation};
pub use collection::ProcessGroupCollection;
pub use error::CollectionError;
pub use group_id::GroupId;
pub use options::{GroupOptionSet, GroupOptions};
pub use plan::CustomGroups;
pub use rebuild::ShrunkLayout;
pub use steps::{BuildHook, BuildStep};
