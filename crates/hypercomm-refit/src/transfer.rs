//! [`Transfer`] and [`Peer`]: one strided copy of a plan, from a source rank or a forwarding destination rank into
//! a destination rank's local shard of one parameter.
//!
//! Ranks are the layouts' own: a [`Peer::Source`] rank is a rank of the source layout, a [`Peer::Destination`] rank
//! and every receiver a rank of the destination layout. An executor whose group numbers the `T` trainer ranks
//! `0..T` and the engine ranks after them maps source rank `r` to `r - source offset` and destination rank `d` to
//! `T + d - destination offset`.

use serde::{Deserialize, Serialize};

use crate::Runs;

/// Who sends a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Peer {
    /// A rank of the source layout, reading its local shard of the parameter.
    Source(usize),
    /// A rank of the destination layout forwarding bytes it received in an earlier bucket to a replica peer,
    /// reading its own local shard of the parameter (laid out as the receiver's).
    Destination(usize),
}

impl Peer {
    /// The rank, in its layout.
    pub fn rank(self) -> usize {
        match self {
            Peer::Source(rank) | Peer::Destination(rank) => rank,
        }
    }
}

impl std::fmt::Display for Peer {
    /// `source 3` or `destination 5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Source(rank) => write!(f, "source {rank}"),
            Peer::Destination(rank) => write!(f, "destination {rank}"),
        }
    }
}

/// One copy of a plan: `runs` of parameter `param` from `from`'s local shard into destination rank `to`'s, in
/// bucket `bucket`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transfer {
    /// The bucket it belongs to; see [`RefitPlan::bucket`](crate::RefitPlan::bucket).
    pub bucket: usize,
    /// The parameter, as an index into [`RefitPlan::params`](crate::RefitPlan::params).
    pub param: usize,
    /// The sender.
    pub from: Peer,
    /// The receiving rank of the destination layout.
    pub to: usize,
    /// The bytes: offsets into the sender's and the receiver's local shard of the parameter.
    pub runs: Runs,
}

impl Transfer {
    /// The bytes it moves.
    pub fn bytes(&self) -> u64 {
        self.runs.bytes()
    }
}
