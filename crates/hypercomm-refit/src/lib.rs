//! Weight refit between layouts: how a model's parameters are laid out on a layout ([`Sharding`]), a plan
//! ([`RefitPlan`]) of which bytes every destination rank needs and which rank sends each, and its execution, so that
//! an RL job can move a trainer's weights into inference engines laid out differently. The plan is pure: every rank
//! computes the same plan alone, with no communication; executing it ([`Refit`]) moves the bytes.
//!
//! 1. Describe the model: a [`Sharding`] lists each parameter (name, full shape, [`DType`]) with its tensor-parallel
//!    [`Split`] (column, row, vocab-parallel, replicated), its pipeline [`Place`] and its expert. [`GptConfig`]
//!    describes Megatron-Core's GPT; `hypercomm::candle`'s tensor-parallel layers describe themselves.
//! 2. Parse or build the two layouts ([`parse_layout`] reads `tp=2,pp=2,dp=2`) and [`RefitPlan::build`] a plan
//!    from one [`Side`] to the other, with [`PlanOptions`] (bucket size, forwarding).
//! 3. Read it bucket by bucket ([`RefitPlan::bucket`]): each [`Transfer`] copies [`Runs`] of one parameter from
//!    its sender's local shard into the receiver's. [`Summary`] and [`explain`] say what it moves, per link and
//!    per rank, against broadcasting full tensors.
//! 4. Run it: every source and destination rank joins a [`RefitGroup`] (under a namespace and an epoch, through
//!    one store, even from two jobs), prepares its side once ([`Refit::new`]) and, after each training step, runs
//!    it ([`Refit::run`]) on its own shards ([`ShardBuffers`]): one batch of sends and receives per bucket, written
//!    straight into the destination's buffers (see the `execute` module).
//!
//! ```
//! use hypercomm_refit::{GptConfig, Peer, PlanOptions, RefitPlan, Side, Summary, parse_layout};
//!
//! // A trainer with tp 2, pp 2, dp 2 (8 ranks) refits two inference replicas of tp 2 (4 ranks).
//! let model = GptConfig::new(4, 1024, 32000).sharding()?;
//! let trainer = parse_layout("tp=2,pp=2,dp=2")?;
//! let engines = parse_layout("tp=2,dp=2")?;
//! let plan = RefitPlan::build(Side::new(&trainer, &model), Side::new(&engines, &model), PlanOptions::default())?;
//!
//! // Every destination byte arrives exactly once: the bytes moved are the bytes the engines hold.
//! assert_eq!(plan.moved_bytes(), plan.needed_bytes());
//! // The trainer sends each engine shard once, all 8 ranks their even share; replicas forward to each other.
//! let summary = Summary::of(&plan);
//! assert_eq!(summary.from_sources, model.bytes()?);
//! assert!(summary.sources.iter().all(|s| (s.sent as f64 - s.share).abs() < 8.0));
//! // Destination rank 3 (tp 1 of the second replica) runs the transfers it takes part in.
//! for t in plan.transfers_of(Peer::Destination(3)) {
//!     let _name = &plan.params()[t.param].name;
//!     for (_src_offset, _dst_offset, _len) in t.runs.iter() { /* copy */ }
//! }
//! # Ok::<(), hypercomm_refit::RefitError>(())
//! ```
//!
//! # Ranks
//!
//! A plan names ranks as its layouts do: [`Peer::Source`] ranks are ranks of the source layout, receivers and
//! [`Peer::Destination`] senders ranks of the destination layout. A group spanning `T` trainer ranks (`0..T`) and
//! the engines after them maps destination rank `d` to `T + d`. Several engine replicas are one destination layout
//! whose dp counts the replicas (`tp=2,dp=2`).
//!
//! # What a transfer moves
//!
//! Offsets are bytes into the local shards, which are row-major: a sender reads and a receiver writes its own
//! shard buffer in place, with no full-tensor copy. [`Runs`] describes a transfer as a contiguous run repeated at
//! fixed strides, so a row-parallel weight re-split between tensor-parallel sizes is one `Runs` per pair of shards,
//! not one per row. A transfer never cuts an element.
//!
//! # Guarantees
//!
//! - Each destination rank receives each byte of each shard it holds exactly once, from a rank that holds it: the
//!   bytes moved equal the bytes the destinations hold, with no padding and nothing discarded.
//! - Sources are chosen among the replicas of each source shard so that the replicas split its bytes evenly: each
//!   source rank sends its balanced share ([`RefitPlan::balanced_share`]) to within two elements per group of
//!   replicas it belongs to, far below one bucket.
//! - With forwarding ([`PlanOptions::forward`], the default), the sources send each destination shard once
//!   whatever the number of destination replicas; the replicas pass it on down a binomial tree in later buckets.
//!   Without, the sources send it to every replica.
//! - In each bucket no rank sends more than the bucket size, nor receives more; forwards read only bytes received
//!   in an earlier bucket.
//! - The plan depends only on its inputs: same layouts, shardings and options, same plan, on every machine.
//!
//! The refit moves bytes between identical tensors: names, shapes and element types must match on both sides. A
//! conversion (to an engine's own QKV order, or another element type) happens before or after.
//!
//! `strategies` (cargo feature `proptest`) generates layout pairs and shardings that fit both, for property tests.

mod balance;
mod chunks;
mod dtype;
mod error;
pub mod execute;
mod explain;
mod gpt;
mod layout_spec;
mod local;
mod placement;
mod plan;
mod runs;
mod schedule;
mod shard;
mod sharding;
mod transfer;

#[cfg(test)]
mod properties;
#[cfg(any(test, feature = "proptest"))]
pub mod strategies;
#[cfg(test)]
mod tests;

pub use dtype::DType;
pub use error::RefitError;
pub use execute::{
    DeviceShards, ExecError, Refit, RefitGroup, RefitGroupOptions, RefitStats, ShardBuffers,
    StagedShards, Staging, group_rank, plan_peer,
};
pub use explain::{
    Baseline, DestinationLoad, LinkLoad, SourceLoad, Summary, explain, format_bytes,
};
pub use gpt::{GptConfig, MAX_GPT_PARAMS};
pub use layout_spec::{describe_layout, parse_layout};
pub use placement::Placement;
pub use plan::{
    DEFAULT_BUCKET_BYTES, MAX_RANKS, MIN_BUCKET_BYTES, PlanOptions, PlanParam, RefitPlan, Side,
    SourceGroup,
};
pub use runs::{Runs, RunsIter, Stride};
pub use sharding::{ParamSharding, Place, Sharding, Split};
pub use transfer::{Peer, Transfer};
