//! Megatron-Core compatible layouts: the parallel sizes of `initialize_model_parallel`, checked with its rules,
//! and every kind of process group it creates, named as the fields of its `ProcessGroupCollection`.
//!
//! 1. Describe the layout with [`LayoutConfig`] (world, tp, pp, cp, ep, etp, order, rank offset, distributed-
//!    optimizer instances, hierarchical cp sizes) and [`build`](LayoutConfig::build) a [`ParallelLayout`].
//! 2. Ask for every group of a [`GroupKind`] with [`ParallelLayout::groups`], or for one rank's group with
//!    [`ParallelLayout::group_of`], which works out that rank's group alone.
//! 3. Reach the underlying grids with [`ParallelLayout::decoder`] and [`ParallelLayout::expert`] for any other
//!    set of dimensions.
//!
//! Where we differ from Megatron-Core, on purpose:
//! - A repeated token in the order string is an error (Megatron accepts it and builds wrong groups).
//! - `dp_cp_ag` always has the members of `dp_cp`, and `expt_dp_ag` those of `expt_dp`, whatever the order and
//!   rank offset (Megatron's `create_all_gather_groups` rebuilds them with order `tp-cp-ep-dp-pp` and offset 0).
//! - The rank offset applies to every group kind (Megatron's `initialize_model_parallel` fixes it at 0).
//!
//! ```
//! use hypercomm_grid::layout::{GroupKind, LayoutConfig};
//!
//! let layout = LayoutConfig::new(64).tp(2).pp(2).cp(2).build()?;
//! assert_eq!(layout.dp(), 8);
//! let mine = layout.group_of(5, GroupKind::DpCp)?.unwrap();
//! assert_eq!(mine.members, [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31]);
//! assert!(!layout.has(GroupKind::ExptDpAg));
//! # Ok::<(), hypercomm_grid::layout::LayoutError>(())
//! ```

mod config;
mod error;
mod groups;
mod kind;
mod order;
mod token;

pub use config::{LayoutConfig, ParallelLayout, TokenSizes, rank_generator};
pub use error::LayoutError;
pub use groups::KindGroups;
pub use kind::GroupKind;
pub use order::Order;
pub use token::Token;
#[cfg(test)]
mod tests;
