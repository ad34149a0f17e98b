//! The error type of grid construction and group queries.

/// Why a grid could not be built or a query could not be answered. Each variant names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GridError {
    /// A grid needs at least one dimension.
    #[error("a grid needs at least one dimension")]
    NoDims,
    /// More dimensions than a grid supports.
    #[error("{count} dimensions given; a grid supports at most {max}")]
    TooManyDims {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A dimension of size zero.
    #[error("dimension {name}=0: sizes must be at least 1")]
    ZeroSize {
        /// The dimension's name.
        name: String,
    },
    /// A dimension with an empty name.
    #[error("dimension #{index} has an empty name")]
    EmptyName {
        /// Position of the dimension in the grid.
        index: usize,
    },
    /// A name that is not a single token (it would make `dp-cp` style selections ambiguous).
    #[error("dimension name {name:?} may contain only letters, digits and '_'")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// Two dimensions share a name.
    #[error("dimension {name} appears more than once")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// The rank space does not fit in `usize`.
    #[error("rank space overflows: offset {offset} plus the product of sizes {dims} exceeds {max}", max = usize::MAX)]
    Overflow {
        /// The dimensions, as `name=size` pairs.
        dims: String,
        /// The rank offset.
        offset: usize,
    },
    /// A selected dimension does not exist in the grid.
    #[error("no dimension {name} in grid {grid}")]
    UnknownDim {
        /// The unknown name.
        name: String,
        /// The grid's dimensions, as `name=size` pairs.
        grid: String,
    },
    /// A dimension named twice in one selection.
    #[error("dimension {name} is selected more than once")]
    DuplicateSelection {
        /// The repeated name.
        name: String,
    },
    /// A rank outside the grid.
    #[error("rank {rank} is outside the grid's ranks {start}..{end}")]
    RankOutOfRange {
        /// The rank asked about.
        rank: usize,
        /// First rank of the grid.
        start: usize,
        /// One past the last rank of the grid.
        end: usize,
    },
    /// Coordinates of the wrong length, or a coordinate not below its dimension's size.
    #[error("coordinates {coords:?} do not fit grid {grid}")]
    BadCoords {
        /// The coordinates given.
        coords: Vec<usize>,
        /// The grid's dimensions, as `name=size` pairs.
        grid: String,
    },
    /// A view covers other ranks than its base grid.
    #[error(
        "view covers ranks {view_start}..{view_end} but its base covers {base_start}..{base_end}"
    )]
    ViewRanks {
        /// First rank of the view.
        view_start: usize,
        /// One past the last rank of the view.
        view_end: usize,
        /// First rank of the base.
        base_start: usize,
        /// One past the last rank of the base.
        base_end: usize,
    },
    /// A view's shared dimensions do not produce the base grid's groups.
    #[error(
        "view disagrees with its base on shared dims {dims}: rank {rank} is in {view_group:?} in the view but in {base_group:?} in the base"
    )]
    ViewMismatch {
        /// The shared dimensions compared, joined by '-'.
        dims: String,
        /// A rank whose groups differ.
        rank: usize,
        /// Its group in the view.
        view_group: Vec<usize>,
        /// Its group in the base.
        base_group: Vec<usize>,
    },
    /// A group cut into a number of parts that does not divide it.
    #[error("groups of {size} ranks cannot be cut into {parts} equal parts")]
    Parts {
        /// The number of parts asked for.
        parts: usize,
        /// The group size.
        size: usize,
    },
    /// Text that is not a grid description.
    #[error("cannot parse {text:?} as {what}: {why}")]
    Parse {
        /// The text.
        text: String,
        /// What it should have been.
        what: &'static str,
        /// Why it is not.
        why: String,
    },
}
