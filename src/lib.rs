#![doc = include_str!("../README.md")]
//!
//! # The crates, as this one re-exports them
//!
//! - [`grid`]: pure topology. Grids over named dimensions, the groups of any set of dimensions, one rank's
//!   group computed directly, and Megatron-Core compatible layouts.
//! - [`plan`]: a layout's groups placed onto a cluster (hosts, NVLink domains, NICs, racks), what their
//!   communication costs there, and a search for the cheapest dimension order and placement.
//! - [`refit`]: weight refit between layouts. How a model's parameters lie on a layout, and a plan of which
//!   bytes every destination rank needs from which source rank, balanced over the replicas, in buckets.
//! - [`store`]: rendezvous. The key-value store every communicator bootstraps through.
//! - [`launch`]: starting a job's local ranks with the rendezvous variables set, and supervising them (the
//!   library behind `hypercomm launch`).
//! - [`comm`]: communicators. One [`Communicator`](comm::Communicator) face whose operations take host vectors
//!   (shared memory on one machine, TCP across machines) or device buffers (NCCL, loaded at run time; see
//!   [`comm::device`]).
//! - [`pgc`]: per rank, the communicators of every group it belongs to (Megatron's `ProcessGroupCollection`).
//! - `candle` (feature `candle`): collectives on candle tensors, a bucketed data-parallel gradient synchroniser
//!   and Megatron's tensor-parallel layers, over the groups of a collection.
//!
//! Nothing in hypercomm is global: every grid, store and communicator is a value you own and pass along, so any
//! number of worlds live side by side in one process.

pub use hypercomm_comm as comm;
pub use hypercomm_grid as grid;
pub use hypercomm_launch as launch;
pub use hypercomm_plan as plan;
pub use hypercomm_refit as refit;
pub use hypercomm_store as store;
pub use process_group_collection as pgc;

#[cfg(feature = "candle")]
pub use hypercomm_candle as candle;

/// The guide's chapters (`docs/guide/`), compiled as doctests so that their code cannot rot.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/guide/README.md")]
    struct Index;
    #[doc = include_str!("../docs/guide/01-grids-and-layouts.md")]
    struct GridsAndLayouts;
    #[doc = include_str!("../docs/guide/02-collections.md")]
    struct Collections;
    #[doc = include_str!("../docs/guide/03-communicator.md")]
    struct TheCommunicator;
    #[doc = include_str!("../docs/guide/04-store-and-launching.md")]
    struct StoreAndLaunching;
    #[cfg(feature = "candle")]
    #[doc = include_str!("../docs/guide/05-candle.md")]
    struct Candle;
    #[doc = include_str!("../docs/guide/06-planning.md")]
    struct Planning;
    #[doc = include_str!("../docs/guide/07-reliability.md")]
    struct Reliability;
    #[doc = include_str!("../docs/guide/08-gpus.md")]
    struct Gpus;
    #[doc = include_str!("../docs/guide/09-refit.md")]
    struct Refit;
}
