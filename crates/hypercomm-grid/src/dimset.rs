//! [`DimSet`]: a set of a grid's dimensions, by position.

/// A set of dimension positions of one grid. Order-insensitive by construction: `{dp, cp}` and `{cp, dp}` are the
/// same set. Build one with [`Grid::select`](crate::Grid::select).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DimSet(u64);

impl DimSet {
    /// The empty set: every rank is its own group.
    pub const EMPTY: DimSet = DimSet(0);

    /// The set of the first `n` positions (all dimensions of an `n`-dimensional grid).
    pub fn all(n: usize) -> DimSet {
        if n >= 64 {
            DimSet(u64::MAX)
        } else {
            DimSet((1u64 << n) - 1)
        }
    }

    /// Whether position `index` is in the set.
    pub fn contains(self, index: usize) -> bool {
        index < 64 && self.0 & (1 << index) != 0
    }

    /// This set plus position `index` (which must be below 64).
    #[must_use]
    pub fn with(self, index: usize) -> DimSet {
        debug_assert!(index < 64);
        DimSet(self.0 | (1 << (index & 63)))
    }

    /// The positions in both sets.
    #[must_use]
    pub fn intersection(self, other: DimSet) -> DimSet {
        DimSet(self.0 & other.0)
    }

    /// The positions of `self` that are not in `other`.
    #[must_use]
    pub fn difference(self, other: DimSet) -> DimSet {
        DimSet(self.0 & !other.0)
    }

    /// The positions in either set.
    #[must_use]
    pub fn union(self, other: DimSet) -> DimSet {
        DimSet(self.0 | other.0)
    }

    /// Whether every position of `self` is in `other`.
    pub fn is_subset(self, other: DimSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The number of positions.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The positions, ascending.
    pub fn indices(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |&i| self.contains(i))
    }
}
