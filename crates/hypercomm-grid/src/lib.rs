//! Pure process-group topology: which ranks form which groups. No I/O, no global state.
//!
//! A [`Grid`] is an ordered list of named dimensions over a contiguous range of ranks. The first dimension varies
//! fastest, as in Megatron-Core's `HyperCommGrid`. For every set of dimensions the grid is partitioned into groups:
//! the ranks that agree on every other coordinate.
//!
//! Take 16 ranks laid out as `tp=2, cp=2, dp=4` starting at rank 0:
//!
//! ```text
//! rank:  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
//! tp:    0  1  0  1  0  1  0  1  0  1  0  1  0  1  0  1
//! cp:    0  0  1  1  0  0  1  1  0  0  1  1  0  0  1  1
//! dp:    0  0  0  0  1  1  1  1  2  2  2  2  3  3  3  3
//! ```
//!
//! ```
//! use hypercomm_grid::Grid;
//!
//! let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 4)])?;
//!
//! // Every tp group, streamed: [0,1], [2,3], ...
//! let tp: Vec<Vec<usize>> = grid.groups(["tp"])?.collect();
//! assert_eq!(tp[..3], [vec![0, 1], vec![2, 3], vec![4, 5]]);
//!
//! // Groups over several dimensions; the order of names does not matter.
//! let dp_cp: Vec<Vec<usize>> = grid.groups(["dp", "cp"])?.collect();
//! assert_eq!(dp_cp, [vec![0, 2, 4, 6, 8, 10, 12, 14], vec![1, 3, 5, 7, 9, 11, 13, 15]]);
//!
//! // One rank's group, computed directly without enumerating the others.
//! let mine = grid.group_of(6, ["dp"])?;
//! assert_eq!(mine.members, [2, 6, 10, 14]);
//! assert_eq!(mine.index, 1);
//! # Ok::<(), hypercomm_grid::GridError>(())
//! ```
//!
//! What to use:
//! - [`Grid`]: build a grid, map ranks to coordinates and back, [`Grid::groups`] and [`Grid::group_of`].
//! - [`GroupRanks`]: a group's members described by `(stride, size)` axes, from [`Grid::compact_group_of`] and
//!   [`layout::ParallelLayout::compact_memberships`]: one rank's groups in O(dims) even when a group spans the
//!   world.
//! - [`layout`]: Megatron-Core layouts (`tp`, `pp`, `cp`, `ep`, `etp`, order, offset, distributed-optimizer
//!   instances, hierarchical cp) and all 22 group kinds of its `ProcessGroupCollection`.
//! - [`GridView`]: a second grid over the same ranks that must agree with a base grid on shared dimensions (the
//!   expert grid sharing `pp` with the decoder grid).
//! - `strategies` (cargo feature `proptest`): proptest strategies for grids and layouts, bounded by a world
//!   size, for your own property tests.
//! - Grids serialize to and from JSON with serde; deserializing validates like [`Grid::new`].
//!
//! Placing a layout's groups onto a cluster (hosts, NVLink domains, NICs) and scoring or searching placements is
//! the `hypercomm-plan` crate's job, built on this one.

mod dimset;
mod error;
mod grid;
mod groups;
pub mod layout;
mod ranks;
mod view;

#[cfg(test)]
mod properties;
#[cfg(any(test, feature = "proptest"))]
pub mod strategies;

pub use dimset::DimSet;
pub use error::GridError;
pub use grid::{Dim, Grid, MAX_DIMS, parse_dims};
pub use groups::Groups;
pub use ranks::{CompactMembership, GroupRanks, GroupRanksIter, Membership};
pub use view::GridView;
