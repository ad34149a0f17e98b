//! One rank's group, with its members listed ([`Membership`]) or described in O(dims) space ([`GroupRanks`];
//! [`CompactMembership`] is one rank's group in that form).
//!
//! A group over a set of dimensions holds `base + Σ i_k · stride_k` for every `i_k < size_k`, enumerated with the
//! earliest axis fastest. Storing the axes instead of the members makes one rank's groups cost the same at any
//! world size, even where a group spans the whole world (`intra_dist_opt` with one optimizer instance). Use
//! [`Grid::group_of`](crate::Grid::group_of) when you want the members as a `Vec`; use the compact form to count,
//! index or stream members without holding them.

use serde::{Deserialize, Serialize};

/// One rank's group: its members and where the rank and the group stand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The members, ascending.
    pub members: Vec<usize>,
    /// The rank's position in `members` (its rank inside the group's communicator).
    pub index: usize,
    /// The group's position in the order [`Grid::groups`](crate::Grid::groups) yields groups.
    pub group: usize,
}

/// The members of one group, ascending, without storing them: positions `start .. start + len` of the
/// enumeration of `base + Σ i_k · stride_k` over `(stride_k, size_k)` axes, earliest axis fastest.
///
/// Invariant (upheld by the constructors in this crate): every stride exceeds the largest offset reachable on
/// the earlier axes, so the enumeration is strictly ascending, and `start + len` is at most the product of the
/// sizes.
///
/// ```
/// use hypercomm_grid::Grid;
///
/// let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 4)])?;
/// let m = grid.compact_group_of(13, ["dp", "cp"])?;
/// assert_eq!(m.ranks.len(), 8);
/// assert_eq!(m.ranks.get(m.index), Some(13));
/// assert_eq!(m.ranks.iter().collect::<Vec<_>>(), [1, 3, 5, 7, 9, 11, 13, 15]);
/// # Ok::<(), hypercomm_grid::GridError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GroupRanks {
    base: usize,
    /// `(stride, size)` per axis, earliest (fastest) first.
    axes: Vec<(usize, usize)>,
    start: usize,
    len: usize,
}

impl GroupRanks {
    /// Positions `start .. start + len` of the product over `axes` shifted by `base`. The caller upholds the type's
    /// invariant.
    pub(crate) fn new(
        base: usize,
        mut axes: Vec<(usize, usize)>,
        start: usize,
        len: usize,
    ) -> Self {
        debug_assert!(start + len <= axes.iter().map(|&(_, s)| s).product::<usize>());
        // An axis of size 1 changes no position's offset or mixed-radix index: drop it.
        axes.retain(|&(_, size)| size > 1);
        GroupRanks {
            base,
            axes,
            start,
            len,
        }
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the group has no members (never true for a group computed from a grid).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The member at position `index` (its rank inside the group's communicator), in O(axes).
    pub fn get(&self, index: usize) -> Option<usize> {
        (index < self.len).then(|| self.base + self.offset_at(self.start + index))
    }

    /// The members, ascending, computed one by one in O(1) amortized each without allocating per member.
    pub fn iter(&self) -> GroupRanksIter<'_> {
        let mut coords = Vec::with_capacity(self.axes.len());
        let mut index = self.start;
        for &(_, size) in &self.axes {
            coords.push(index % size);
            index /= size;
        }
        GroupRanksIter {
            axes: &self.axes,
            coords,
            next: self.base + self.offset_at(self.start),
            left: self.len,
        }
    }

    /// The members as a `Vec`, ascending.
    pub fn to_vec(&self) -> Vec<usize> {
        let whole = self.axes.iter().map(|&(_, s)| s).product::<usize>();
        if self.start != 0 || self.len != whole {
            return self.iter().collect();
        }
        let mut out = Vec::with_capacity(self.len);
        out.push(self.base);
        // Each axis multiplies the offsets collected so far; the type's invariant keeps the result ascending.
        for &(stride, size) in &self.axes {
            let block = out.len();
            for step in 1..size {
                for j in 0..block {
                    let v = out[j] + step * stride;
                    out.push(v);
                }
            }
        }
        out
    }

    /// The rank every member is offset from.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The `(stride, size)` axes, earliest (fastest-varying) first; axes of size 1 are left out.
    pub fn axes(&self) -> &[(usize, usize)] {
        &self.axes
    }

    /// The position in the enumeration of the axes where the members begin (0 unless the group is a part of a
    /// larger product, as a hierarchical context-parallel level is).
    pub fn start(&self) -> usize {
        self.start
    }

    /// `Σ coord · stride` of the position with mixed-radix index `index` on the axes.
    fn offset_at(&self, mut index: usize) -> usize {
        let mut offset = 0;
        for &(stride, size) in &self.axes {
            offset += (index % size) * stride;
            index /= size;
        }
        offset
    }
}

/// `{"base":B,"axes":[[stride,size],...],"start":S,"len":L}`: member `i` is `B + Σ_k d_k · stride_k`, where
/// `d_k` are the mixed-radix digits of `S + i` over the sizes, the first axis varying fastest. Its size is
/// O(dimensions) at any world size, where the member list is O(group size).
///
/// ```
/// use hypercomm_grid::Grid;
///
/// let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 4)])?;
/// let m = grid.compact_group_of(13, ["dp", "cp"])?;
/// assert_eq!(
///     serde_json::to_string(&m.ranks)?,
///     r#"{"base":1,"axes":[[2,2],[4,4]],"start":0,"len":8}"#
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl serde::Serialize for GroupRanks {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("GroupRanks", 4)?;
        s.serialize_field("base", &self.base)?;
        s.serialize_field("axes", &self.axes)?;
        s.serialize_field("start", &self.start)?;
        s.serialize_field("len", &self.len)?;
        s.end()
    }
}

impl<'a> IntoIterator for &'a GroupRanks {
    type Item = usize;
    type IntoIter = GroupRanksIter<'a>;
    fn into_iter(self) -> GroupRanksIter<'a> {
        self.iter()
    }
}

/// The members of a [`GroupRanks`], ascending; see [`GroupRanks::iter`].
#[derive(Debug, Clone)]
pub struct GroupRanksIter<'a> {
    axes: &'a [(usize, usize)],
    coords: Vec<usize>,
    next: usize,
    left: usize,
}

impl Iterator for GroupRanksIter<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let current = self.next;
        if self.left > 0 {
            self.advance();
        }
        Some(current)
    }

    /// Runs along the fastest axis in a tight loop; `for_each` and `sum` come here.
    fn fold<B, F: FnMut(B, usize) -> B>(mut self, init: B, mut f: F) -> B {
        let mut acc = init;
        while self.left > 0 {
            let Some(&(stride, size)) = self.axes.first() else {
                // No axes: a single member.
                return f(acc, self.next);
            };
            let run = (size - self.coords[0]).min(self.left);
            for step in 0..run {
                acc = f(acc, self.next + step * stride);
            }
            self.left -= run;
            if self.left > 0 {
                // Stand on the run's last member, then step past it with the carry.
                self.next += (run - 1) * stride;
                self.coords[0] += run - 1;
                self.advance();
            }
        }
        acc
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl GroupRanksIter<'_> {
    /// Moves `next` to the following member; the caller checks that there is one. Carries from the fastest axis;
    /// `next` only drops while carrying and ends on a member, so it never leaves the grid's rank range (no overflow
    /// next to `usize::MAX`).
    fn advance(&mut self) {
        for (coord, &(stride, size)) in self.coords.iter_mut().zip(self.axes) {
            if *coord + 1 < size {
                *coord += 1;
                self.next += stride;
                return;
            }
            self.next -= stride * (size - 1);
            *coord = 0;
        }
    }
}

impl ExactSizeIterator for GroupRanksIter<'_> {}

/// One rank's group in compact form: [`Membership`] with [`GroupRanks`] in place of the member list.
#[derive(Debug, Clone)]
pub struct CompactMembership {
    /// The members.
    pub ranks: GroupRanks,
    /// The rank's position in `ranks`.
    pub index: usize,
    /// The group's position in the order the grid (or layout) yields groups.
    pub group: usize,
}

impl CompactMembership {
    /// The same membership with the members listed.
    pub fn to_membership(&self) -> Membership {
        Membership {
            members: self.ranks.to_vec(),
            index: self.index,
            group: self.group,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_positions_crosses_axes() {
        // Axes (1, 3) then (10, 2): 0 1 2 10 11 12, base 100; positions 2..5.
        let ranks = GroupRanks::new(100, vec![(1, 3), (10, 2)], 2, 3);
        assert_eq!(ranks.iter().collect::<Vec<_>>(), [102, 110, 111]);
        assert_eq!(ranks.to_vec(), [102, 110, 111]);
        assert_eq!(ranks.get(0), Some(102));
        assert_eq!(ranks.get(2), Some(111));
        assert_eq!(ranks.get(3), None);
        assert_eq!(ranks.iter().len(), 3);
        let mut folded = Vec::new();
        ranks.iter().for_each(|r| folded.push(r));
        assert_eq!(folded, [102, 110, 111]);
    }

    #[test]
    fn fold_matches_next_from_any_point() {
        let ranks = GroupRanks::new(3, vec![(1, 3), (5, 1), (10, 2), (40, 3)], 1, 16);
        let stepped: Vec<usize> = std::iter::from_fn({
            let mut it = ranks.iter();
            move || it.next()
        })
        .collect();
        assert_eq!(stepped.len(), 16);
        assert!(stepped.windows(2).all(|w| w[0] < w[1]));
        for skip in 0..=16 {
            let mut it = ranks.iter();
            it.by_ref().take(skip).for_each(drop);
            let mut rest = Vec::new();
            it.for_each(|r| rest.push(r));
            assert_eq!(rest, stepped[skip.min(16)..], "after {skip}");
        }
        assert_eq!(stepped[0], 4);
        assert_eq!(stepped[15], 3 + 1 + 10 + 80);
    }

    #[test]
    fn whole_products_list_the_same_either_way() {
        let ranks = GroupRanks::new(7, vec![(1, 2), (4, 3), (24, 2)], 0, 12);
        let listed = ranks.to_vec();
        assert_eq!(listed, ranks.iter().collect::<Vec<_>>());
        assert_eq!(listed, [7, 8, 11, 12, 15, 16, 31, 32, 35, 36, 39, 40]);
        let single = GroupRanks::new(5, Vec::new(), 0, 1);
        assert_eq!(single.to_vec(), [5]);
        assert_eq!(single.iter().collect::<Vec<_>>(), [5]);
    }
}
