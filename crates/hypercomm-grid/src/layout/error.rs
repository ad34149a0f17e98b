//! [`LayoutError`]: why a parallel layout is invalid, or why it has no group of some kind.

use super::token::Token;
use crate::GridError;

/// Why a [`ParallelLayout`](crate::layout::ParallelLayout) could not be built or queried. Each variant names the
/// values involved and the rule they broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// An order string token that is not one of tp, cp, ep, dp, pp.
    #[error("order {order:?} has unknown token {token:?} (known: tp, cp, ep, dp, pp)")]
    UnknownToken {
        /// The order string.
        order: String,
        /// The unknown token.
        token: String,
    },
    /// A token named twice in the order string.
    #[error("order {order:?} names {token} more than once")]
    RepeatedToken {
        /// The order string.
        order: String,
        /// The repeated token.
        token: Token,
    },
    /// A dimension of size greater than 1 that the order string leaves out.
    #[error(
        "order {order:?} leaves out {token}, whose size is {size} (only size-1 dims may be left out)"
    )]
    MissingToken {
        /// The order string.
        order: String,
        /// The missing token.
        token: Token,
        /// Its size.
        size: usize,
    },
    /// A parallel size of zero.
    #[error("{name}=0: parallel sizes must be at least 1")]
    ZeroSize {
        /// The size's name (`world`, `tp`, ...).
        name: &'static str,
    },
    /// A product of parallel sizes that does not divide the world.
    #[error("{what}={product} does not divide world {world}")]
    NotDivisible {
        /// The product, spelled out (`tp*pp*cp`).
        what: &'static str,
        /// Its value.
        product: usize,
        /// The world size.
        world: usize,
    },
    /// Expert parallelism and context parallelism both above 1 in one rank generator.
    #[error(
        "ep={ep} and cp={cp} cannot both exceed 1 in one grid (Megatron puts cp only in the decoder grid and ep only in the expert grid)"
    )]
    EpWithCp {
        /// The expert-parallel size.
        ep: usize,
        /// The context-parallel size.
        cp: usize,
    },
    /// A distributed-optimizer instance count that does not divide the data-parallel domain.
    #[error("{instances} distributed-optimizer instances do not divide {domain}={size}")]
    DistOptInstances {
        /// The instance count.
        instances: usize,
        /// The domain divided (`dp*cp` or `expert_dp`).
        domain: &'static str,
        /// Its size.
        size: usize,
    },
    /// A hierarchical context-parallel size of zero, or an empty list.
    #[error("hierarchical cp sizes {sizes:?} must be a non-empty list of sizes of at least 1")]
    HierarchicalCpSizes {
        /// The sizes given.
        sizes: Vec<usize>,
    },
    /// Hierarchical context-parallel sizes whose product is not cp.
    #[error("hierarchical cp sizes {sizes:?} multiply to {product}, not cp={cp}")]
    HierarchicalCp {
        /// The sizes given.
        sizes: Vec<usize>,
        /// Their product.
        product: usize,
        /// The context-parallel size.
        cp: usize,
    },
    /// An order with pp not slowest, while the decoder and expert data-parallel sizes differ.
    #[error(
        "order {order} puts a dim of size > 1 after pp, so dp={dp} and expert dp={expert_dp} must be equal (pp={pp})"
    )]
    PpNotLast {
        /// The order.
        order: String,
        /// The decoder data-parallel size.
        dp: usize,
        /// The expert data-parallel size.
        expert_dp: usize,
        /// The pipeline-parallel size.
        pp: usize,
    },
    /// A kind with several groups per rank asked for as one group.
    #[error("{kind} has one group per level for each rank; ask for all of them")]
    MultiLevel {
        /// The kind's name.
        kind: &'static str,
    },
    /// A level of a multi-level kind that the layout does not have.
    #[error("{kind} has levels 0..{levels}, not level {level}")]
    NoSuchLevel {
        /// The kind's name.
        kind: &'static str,
        /// The level asked for.
        level: usize,
        /// How many levels there are.
        levels: usize,
    },
    /// A group kind name that does not exist.
    #[error("unknown group kind {name:?} (known: {known})")]
    UnknownKind {
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A group kind this layout does not have.
    #[error("this layout has no {kind} group: {why}")]
    KindAbsent {
        /// The kind's name.
        kind: &'static str,
        /// Why the layout lacks it.
        why: &'static str,
    },
    /// An error from the underlying grids.
    #[error(transparent)]
    Grid(#[from] GridError),
}
