//! [`GridView`]: a second grid over the same ranks that shares some dimensions with a base grid.
//!
//! Megatron-Core lays out expert layers on a grid `etp-ep-edp-pp` beside the decoder grid `tp-cp-dp-pp`; both must
//! agree on the pipeline groups, or a rank would hold different pipeline peers for its dense and its expert layers.
//! A view is only built when every shared dimension (each alone, and all together) produces exactly the base grid's
//! groups.

use std::ops::Deref;

use crate::{DimSet, Grid, GridError};

/// A grid checked to agree with a base grid on its shared dimensions. Dereferences to the view's own [`Grid`].
///
/// ```
/// use hypercomm_grid::{Grid, GridView};
///
/// let decoder = Grid::new([("tp", 2), ("cp", 2), ("dp", 2), ("pp", 2)])?;
/// let expert = Grid::new([("etp", 1), ("ep", 4), ("edp", 2), ("pp", 2)])?;
/// let view = GridView::new(&decoder, expert, ["pp"])?;
/// assert_eq!(view.shared(), ["pp"]);
///
/// // Putting pp first changes the pipeline groups: rejected.
/// let wrong = Grid::new([("pp", 2), ("ep", 4), ("edp", 2)])?;
/// assert!(GridView::new(&decoder, wrong, ["pp"]).is_err());
/// # Ok::<(), hypercomm_grid::GridError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridView {
    grid: Grid,
    shared: Vec<String>,
}

impl GridView {
    /// Checks `grid` against `base` on the dimensions in `shared` and wraps it.
    ///
    /// Fails when the two grids cover different ranks, a shared name is missing from either, or some rank's group
    /// over a shared dimension (or over all of them together) differs between the two.
    pub fn new<S: AsRef<str>>(
        base: &Grid,
        grid: Grid,
        shared: impl IntoIterator<Item = S>,
    ) -> Result<GridView, GridError> {
        if base.ranks() != grid.ranks() {
            return Err(GridError::ViewRanks {
                view_start: grid.offset(),
                view_end: grid.offset() + grid.size(),
                base_start: base.offset(),
                base_end: base.offset() + base.size(),
            });
        }
        let shared: Vec<String> = shared.into_iter().map(|s| s.as_ref().to_owned()).collect();
        // Validate every name in both grids (unknown and duplicate names) before comparing groups.
        base.select(&shared)?;
        grid.select(&shared)?;
        for name in &shared {
            same_groups(base, &grid, std::slice::from_ref(name))?;
        }
        if shared.len() > 1 {
            same_groups(base, &grid, &shared)?;
        }
        Ok(GridView { grid, shared })
    }

    /// The view's own grid.
    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The dimensions checked to agree with the base.
    pub fn shared(&self) -> &[String] {
        &self.shared
    }

    /// Unwraps the view's own grid.
    pub fn into_grid(self) -> Grid {
        self.grid
    }
}

impl Deref for GridView {
    type Target = Grid;
    fn deref(&self) -> &Grid {
        &self.grid
    }
}

/// Checks that `a` and `b` (over the same ranks) partition them into the same groups over `dims`, in O(dims).
///
/// A grid's partition over a set depends only on its *runs*: the dimensions of size > 1 in grid order, adjacent
/// ones merged while they are all in the set or all outside it. Equal runs give equal partitions. Unequal runs
/// give a different group for the first rank, because that group determines the runs: its smallest step is the
/// size of a leading outside run (or 1), the length of the arithmetic run that follows is the first inside run,
/// and so on. So the runs are compared, and when they differ the first rank's two groups are the witness.
fn same_groups(a: &Grid, b: &Grid, dims: &[String]) -> Result<(), GridError> {
    let (a_set, b_set) = (a.select(dims)?, b.select(dims)?);
    if partition_runs(a, a_set) == partition_runs(b, b_set) {
        return Ok(());
    }
    let first = a.offset();
    Err(GridError::ViewMismatch {
        dims: dims.join("-"),
        rank: first,
        view_group: b.group_of_in(first, b_set)?.members,
        base_group: a.group_of_in(first, a_set)?.members,
    })
}

/// The runs of `grid` over `set`: `(inside the set, product of sizes)` for each maximal stretch of dimensions of
/// size > 1 that are all inside or all outside, fastest first.
fn partition_runs(grid: &Grid, set: DimSet) -> Vec<(bool, usize)> {
    let mut runs: Vec<(bool, usize)> = Vec::new();
    for (index, dim) in grid.dims().iter().enumerate() {
        if dim.size == 1 {
            continue;
        }
        let inside = set.contains(index);
        match runs.last_mut() {
            Some((was_inside, size)) if *was_inside == inside => *size *= dim.size,
            _ => runs.push((inside, dim.size)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_other_ranks_and_unknown_names() {
        let base = Grid::new([("tp", 2), ("pp", 2)]).unwrap();
        let shifted = Grid::with_offset([("tp", 2), ("pp", 2)], 4).unwrap();
        assert!(matches!(
            GridView::new(&base, shifted, ["pp"]),
            Err(GridError::ViewRanks { .. })
        ));
        let other = Grid::new([("ep", 2), ("pp", 2)]).unwrap();
        assert!(matches!(
            GridView::new(&base, other, ["tp"]),
            Err(GridError::UnknownDim { .. })
        ));
    }

    #[test]
    fn mismatch_names_a_rank_and_both_groups() {
        let base = Grid::new([("tp", 2), ("pp", 2)]).unwrap();
        let swapped = Grid::new([("pp", 2), ("tp", 2)]).unwrap();
        let err = GridView::new(&base, swapped, ["pp"]).unwrap_err();
        assert_eq!(
            err,
            GridError::ViewMismatch {
                dims: "pp".into(),
                rank: 0,
                view_group: vec![0, 1],
                base_group: vec![0, 2],
            }
        );
    }

    #[test]
    fn checks_shared_dims_together_and_alone() {
        let base = Grid::new([("tp", 2), ("dp", 2), ("pp", 2)]).unwrap();
        let view = Grid::new([("ep", 2), ("dp", 2), ("pp", 2)]).unwrap();
        let v = GridView::new(&base, view, ["pp", "dp"]).unwrap();
        assert_eq!(v.size(), 8);
        assert_eq!(v.shared(), ["pp", "dp"]);
    }
}
