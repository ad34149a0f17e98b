//! Running a [`RefitPlan`](crate::RefitPlan): every rank's batched sends and receives, bucket by bucket, over a
//! communicator spanning the source and the destination ranks, straight out of and into the ranks' own buffers.
//!
//! 1. Join the group: [`RefitGroup::join`] (or [`RefitGroup::for_plan`]) on every source and destination rank,
//!    under a namespace and an epoch ([`RefitGroupOptions`]).
//! 2. Prepare this rank's side once: [`Refit::new`] works out its messages per bucket.
//! 3. After each training step, [`Refit::run`] (or [`RefitGroup::run`]) with this rank's shards as
//!    [`ShardBuffers`]: plain vectors by plan index, or any buffers that lend their bytes (candle tensors through
//!    `hypercomm::candle`), or as [`DeviceShards`]: device buffers, run on the communicator's NCCL flavor.
//!
//! - `messages`: what one rank sends and receives per bucket ([`group_rank`] numbers the ranks).
//! - `shards`: [`ShardBuffers`], the rank's shards as bytes, and [`StagedShards`], what the executor asks of
//!   shards of either flavor.
//! - `device`: [`DeviceShards`], shards in device memory, staged in device buffers.
//! - `run`: [`Refit`], packing, one batch per bucket, unpacking.
//! - `group`: [`RefitGroup`], namespaces, epochs and the store keys.
//! - `ledger`: the keys a rank wrote, deleted once read.
//! - `error`: [`ExecError`].

mod device;
mod error;
mod group;
mod ledger;
mod messages;
mod run;
mod shards;

pub use device::DeviceShards;
pub use error::ExecError;
pub use group::{RefitGroup, RefitGroupOptions};
pub use messages::{group_rank, plan_peer};
pub use run::{Refit, RefitStats};
pub use shards::{ReadShard, ShardBuffers, StagedShards, Staging, WriteShard};

#[cfg(test)]
mod tests;
