//! Groups over a set of dimensions: every group, streamed ([`Groups`]), or one rank's group computed directly
//! ([`Grid::group_of`]).
//!
//! A group over a set `S` of dimensions is the set of ranks that agree on every coordinate outside `S`. Inside a
//! group, members vary over `S` in grid order, earliest dimension fastest; groups are ordered over the remaining
//! dimensions, earliest fastest. With the first dimension varying fastest in the rank mapping, both orders make every
//! group ascending.

use crate::{CompactMembership, DimSet, Grid, GridError, GroupRanks, Membership};

/// A mixed-radix counter over some of a grid's dimensions: `(stride, size)` per dimension, earliest fastest.
#[derive(Debug, Clone)]
struct Odometer {
    axes: Vec<(usize, usize)>,
}

impl Odometer {
    fn over(grid: &Grid, set: DimSet) -> Odometer {
        Odometer {
            axes: set
                .intersection(DimSet::all(grid.dims().len()))
                .indices()
                .map(|i| (grid.strides()[i], grid.dims()[i].size))
                .collect(),
        }
    }

    /// The number of positions the counter runs through.
    fn count(&self) -> usize {
        self.axes.iter().map(|&(_, size)| size).product()
    }

    /// The positions `start .. start + len` of this counter, as ranks shifted by `base`. Strides of a grid's
    /// dimensions grow with each dimension and exceed the span of all earlier ones, as [`GroupRanks`] requires.
    fn ranks(self, base: usize, start: usize, len: usize) -> GroupRanks {
        GroupRanks::new(base, self.axes, start, len)
    }

    /// The mixed-radix index of `local` (a rank minus the grid offset) on these axes, and its offset
    /// `Σ coord · stride` on them.
    fn position(&self, local: usize) -> (usize, usize) {
        let mut index = 0;
        let mut offset = 0;
        let mut radix = 1;
        for &(stride, size) in &self.axes {
            let coord = (local / stride) % size;
            index += coord * radix;
            offset += coord * stride;
            radix *= size;
        }
        (index, offset)
    }
}

/// Every group over a set of dimensions, as a stream: only the current group is in memory.
///
/// Yields `Vec<usize>` per group; [`Groups::next_into`] reuses one buffer instead.
///
/// ```
/// use hypercomm_grid::Grid;
///
/// let grid = Grid::new([("tp", 2), ("pp", 4)])?;
/// let pp: Vec<Vec<usize>> = grid.groups(["pp"])?.collect();
/// assert_eq!(pp, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
/// # Ok::<(), hypercomm_grid::GridError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Groups {
    /// Member offsets relative to a group's first rank, ascending.
    members: Vec<usize>,
    /// Counter over the dimensions outside the set; its current value is `coords`.
    outer: Odometer,
    coords: Vec<usize>,
    /// First rank of the next group.
    base: usize,
    /// Groups not yet yielded.
    left: usize,
}

impl Groups {
    fn new(grid: &Grid, set: DimSet) -> Groups {
        let inner = Odometer::over(grid, set);
        let outer = Odometer::over(grid, DimSet::all(grid.dims().len()).difference(set));
        let count = inner.count();
        let members = inner.ranks(0, 0, count).to_vec();
        let left = outer.count();
        Groups {
            members,
            coords: vec![0; outer.axes.len()],
            outer,
            base: grid.offset(),
            left,
        }
    }

    /// The number of ranks in each group.
    pub fn group_size(&self) -> usize {
        self.members.len()
    }

    /// Writes the next group into `buf` (cleared first); returns `false` when there are no more groups.
    pub fn next_into(&mut self, buf: &mut Vec<usize>) -> bool {
        if self.left == 0 {
            return false;
        }
        buf.clear();
        buf.extend(self.members.iter().map(|m| self.base + m));
        self.advance();
        true
    }

    fn advance(&mut self) {
        self.left -= 1;
        for (coord, &(stride, size)) in self.coords.iter_mut().zip(&self.outer.axes) {
            *coord += 1;
            self.base += stride;
            if *coord < size {
                return;
            }
            self.base -= stride * size;
            *coord = 0;
        }
    }
}

impl Iterator for Groups {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let mut buf = Vec::with_capacity(self.members.len());
        self.next_into(&mut buf).then_some(buf)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Groups {}

impl Grid {
    /// Every group over the dimensions named in `dims` (any order), streamed.
    pub fn groups<S: AsRef<str>>(
        &self,
        dims: impl IntoIterator<Item = S>,
    ) -> Result<Groups, GridError> {
        Ok(self.groups_in(self.select(dims)?))
    }

    /// Every group over the dimensions in `set`, streamed.
    pub fn groups_in(&self, set: DimSet) -> Groups {
        Groups::new(self, set)
    }

    /// The number of ranks in each group over `set`.
    pub fn group_size_in(&self, set: DimSet) -> usize {
        Odometer::over(self, set).count()
    }

    /// The group over the dimensions named in `dims` that contains `rank`, computed directly in O(group size)
    /// without enumerating any other group: the decentralized primitive.
    ///
    /// ```
    /// use hypercomm_grid::Grid;
    ///
    /// let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 4)])?;
    /// let m = grid.group_of(13, ["dp", "cp"])?;
    /// assert_eq!(m.members, vec![1, 3, 5, 7, 9, 11, 13, 15]);
    /// assert_eq!(m.index, 6);
    /// assert_eq!(m.group, 1);
    /// # Ok::<(), hypercomm_grid::GridError>(())
    /// ```
    pub fn group_of<S: AsRef<str>>(
        &self,
        rank: usize,
        dims: impl IntoIterator<Item = S>,
    ) -> Result<Membership, GridError> {
        self.group_of_in(rank, self.select(dims)?)
    }

    /// [`Grid::group_of`] for a [`DimSet`].
    pub fn group_of_in(&self, rank: usize, set: DimSet) -> Result<Membership, GridError> {
        Ok(self.compact_group_of_in(rank, set)?.to_membership())
    }

    /// [`Grid::group_of`] with the members described, not listed: O(dims) time and space whatever the group size.
    ///
    /// ```
    /// use hypercomm_grid::Grid;
    ///
    /// // 2^40 ranks: the group over dp has 2^36 members, none of them stored.
    /// let grid = Grid::new([("tp", 8), ("cp", 2), ("dp", 1 << 36)])?;
    /// let m = grid.compact_group_of(17, ["dp"])?;
    /// assert_eq!((m.ranks.len(), m.index, m.group), (1 << 36, 1, 1));
    /// assert_eq!(m.ranks.iter().take(3).collect::<Vec<_>>(), [1, 17, 33]);
    /// # Ok::<(), hypercomm_grid::GridError>(())
    /// ```
    pub fn compact_group_of<S: AsRef<str>>(
        &self,
        rank: usize,
        dims: impl IntoIterator<Item = S>,
    ) -> Result<CompactMembership, GridError> {
        self.compact_group_of_in(rank, self.select(dims)?)
    }

    /// [`Grid::compact_group_of`] for a [`DimSet`].
    pub fn compact_group_of_in(
        &self,
        rank: usize,
        set: DimSet,
    ) -> Result<CompactMembership, GridError> {
        let local = self.local(rank)?;
        let all = DimSet::all(self.dims().len());
        let inner = Odometer::over(self, set);
        let outer = Odometer::over(self, all.difference(set));
        let (index, inner_offset) = inner.position(local);
        let (group, _) = outer.position(local);
        let count = inner.count();
        Ok(CompactMembership {
            ranks: inner.ranks(rank - inner_offset, 0, count),
            index,
            group,
        })
    }
}

impl Grid {
    /// The part of `rank`'s group over `set` that holds it, when each group is cut into `parts` runs of
    /// consecutive members. Megatron-Core cuts data-parallel groups this way among distributed-optimizer
    /// instances. `index` is the rank's position in its part; `group` numbers parts `parent_group * parts + part`.
    ///
    /// Fails when `parts` is 0 or does not divide the group size.
    ///
    /// ```
    /// use hypercomm_grid::Grid;
    ///
    /// let grid = Grid::new([("cp", 2), ("dp", 4)])?;
    /// let set = grid.select(["dp", "cp"])?;
    /// let m = grid.group_part_of(5, set, 2)?;
    /// assert_eq!((m.members, m.index, m.group), (vec![4, 5, 6, 7], 1, 1));
    /// # Ok::<(), hypercomm_grid::GridError>(())
    /// ```
    pub fn group_part_of(
        &self,
        rank: usize,
        set: DimSet,
        parts: usize,
    ) -> Result<Membership, GridError> {
        Ok(self
            .compact_group_part_of(rank, set, parts)?
            .to_membership())
    }

    /// [`Grid::group_part_of`] with the members described, not listed: O(dims) whatever the part's size.
    pub fn compact_group_part_of(
        &self,
        rank: usize,
        set: DimSet,
        parts: usize,
    ) -> Result<CompactMembership, GridError> {
        let local = self.local(rank)?;
        let inner = Odometer::over(self, set);
        let size = inner.count();
        let part_size = part_size(size, parts)?;
        let (position, inner_offset) = inner.position(local);
        let (parent, _) =
            Odometer::over(self, DimSet::all(self.dims().len()).difference(set)).position(local);
        let part = position / part_size;
        Ok(CompactMembership {
            ranks: inner.ranks(rank - inner_offset, part * part_size, part_size),
            index: position % part_size,
            group: parent * parts + part,
        })
    }

    /// Every part of every group over `set` cut into `parts` runs of consecutive members, in the order
    /// [`Grid::group_part_of`] numbers them.
    pub fn group_parts_in(
        &self,
        set: DimSet,
        parts: usize,
    ) -> Result<impl ExactSizeIterator<Item = Vec<usize>> + Send + use<>, GridError> {
        let groups = self.groups_in(set);
        let part_size = part_size(groups.group_size(), parts)?;
        Ok(PartsIter {
            groups,
            part_size,
            current: Vec::new(),
            next_part: parts,
            parts,
        })
    }
}

fn part_size(size: usize, parts: usize) -> Result<usize, GridError> {
    if parts == 0 || size % parts != 0 {
        return Err(GridError::Parts { parts, size });
    }
    Ok(size / parts)
}

/// Streams the parts of each group in turn.
struct PartsIter {
    groups: Groups,
    part_size: usize,
    current: Vec<usize>,
    next_part: usize,
    parts: usize,
}

impl Iterator for PartsIter {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        if self.next_part == self.parts {
            if !self.groups.next_into(&mut self.current) {
                return None;
            }
            self.next_part = 0;
        }
        let start = self.next_part * self.part_size;
        self.next_part += 1;
        Some(self.current[start..start + self.part_size].to_vec())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.groups.len() * self.parts + (self.parts - self.next_part);
        (left, Some(left))
    }
}

impl ExactSizeIterator for PartsIter {}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(grid: &Grid, dims: &[&str]) -> Vec<Vec<usize>> {
        grid.groups(dims.iter().copied()).unwrap().collect()
    }

    #[test]
    fn megatron_docstring_example_world_16_tp_2_pp_4() {
        // Megatron-Core's initialize_model_parallel docstring: 16 GPUs, tp 2, pp 4 (dp 2), order tp-dp-pp.
        let grid = Grid::new([("tp", 2), ("dp", 2), ("pp", 4)]).unwrap();
        assert_eq!(
            all(&grid, &["tp"]),
            vec![
                vec![0, 1],
                vec![2, 3],
                vec![4, 5],
                vec![6, 7],
                vec![8, 9],
                vec![10, 11],
                vec![12, 13],
                vec![14, 15]
            ]
        );
        assert_eq!(
            all(&grid, &["pp"]),
            vec![
                vec![0, 4, 8, 12],
                vec![1, 5, 9, 13],
                vec![2, 6, 10, 14],
                vec![3, 7, 11, 15]
            ]
        );
        assert_eq!(
            all(&grid, &["dp"]),
            vec![
                vec![0, 2],
                vec![1, 3],
                vec![4, 6],
                vec![5, 7],
                vec![8, 10],
                vec![9, 11],
                vec![12, 14],
                vec![13, 15]
            ]
        );
    }

    #[test]
    fn members_follow_grid_order_and_groups_the_remaining_dims() {
        let grid = Grid::new([("a", 2), ("b", 3), ("c", 2)]).unwrap();
        // Members vary over {a, c}, a fastest; groups are ordered by b.
        assert_eq!(
            all(&grid, &["c", "a"]),
            vec![vec![0, 1, 6, 7], vec![2, 3, 8, 9], vec![4, 5, 10, 11]]
        );
        assert_eq!(
            all(&grid, &["a", "b", "c"]),
            vec![(0..12).collect::<Vec<_>>()]
        );
        assert_eq!(
            all(&grid, &[]),
            (0..12).map(|r| vec![r]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn offset_applies_to_every_member() {
        let grid = Grid::with_offset([("tp", 2), ("pp", 2)], 10).unwrap();
        assert_eq!(all(&grid, &["pp"]), vec![vec![10, 12], vec![11, 13]]);
        let m = grid.group_of(13, ["pp"]).unwrap();
        assert_eq!((m.members, m.index, m.group), (vec![11, 13], 1, 1));
        assert!(grid.group_of(14, ["pp"]).is_err());
    }

    #[test]
    fn streaming_reports_exact_size_and_reuses_buffers() {
        let grid = Grid::new([("tp", 4), ("dp", 8)]).unwrap();
        let mut groups = grid.groups(["tp"]).unwrap();
        assert_eq!(groups.len(), 8);
        assert_eq!(groups.group_size(), 4);
        let mut buf = Vec::new();
        let mut seen = 0;
        while groups.next_into(&mut buf) {
            assert_eq!(buf, (seen * 4..seen * 4 + 4).collect::<Vec<_>>());
            seen += 1;
        }
        assert_eq!(seen, 8);
        assert_eq!(groups.len(), 0);
    }

    #[test]
    fn parts_agree_between_streaming_and_direct() {
        let grid = Grid::new([("tp", 2), ("cp", 3), ("dp", 4)]).unwrap();
        let set = grid.select(["dp", "cp"]).unwrap();
        let parts: Vec<Vec<usize>> = grid.group_parts_in(set, 4).unwrap().collect();
        assert_eq!(parts.len(), 8);
        assert_eq!(parts[0], vec![0, 2, 4]);
        assert_eq!(parts[1], vec![6, 8, 10]);
        for (index, part) in parts.iter().enumerate() {
            for (position, &rank) in part.iter().enumerate() {
                let m = grid.group_part_of(rank, set, 4).unwrap();
                assert_eq!((&m.members, m.index, m.group), (part, position, index));
            }
        }
        assert_eq!(
            grid.group_parts_in(set, 5).err(),
            Some(GridError::Parts { parts: 5, size: 12 })
        );
        assert!(grid.group_part_of(0, set, 0).is_err());
    }

    #[test]
    fn group_of_errors_name_the_problem() {
        let grid = Grid::new([("tp", 2)]).unwrap();
        assert!(matches!(
            grid.group_of(0, ["ep"]),
            Err(GridError::UnknownDim { .. })
        ));
        assert_eq!(
            grid.group_of(2, ["tp"]),
            Err(GridError::RankOutOfRange {
                rank: 2,
                start: 0,
                end: 2
            })
        );
    }
}
