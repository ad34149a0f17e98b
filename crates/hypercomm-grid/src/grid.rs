//! [`Grid`]: named dimensions over a contiguous range of ranks, and the rank <-> coordinates mapping.
//!
//! The first dimension varies fastest: `rank = offset + Σ coord[d] · stride[d]`, with `stride[0] = 1` and
//! `stride[d+1] = stride[d] · size[d]`. This is Megatron-Core's `HyperCommGrid` order and its `RankGenerator` order
//! string read left to right (`tp-cp-ep-dp-pp`: tp fastest, pp slowest).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{DimSet, GridError};

/// The most dimensions a grid may have (a [`DimSet`] is a 64-bit mask).
pub const MAX_DIMS: usize = 64;

/// A named dimension and its size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dim {
    /// The name, e.g. `tp`. Letters, digits and `_` only.
    pub name: String,
    /// The number of positions along this dimension, at least 1.
    pub size: usize,
}

impl Dim {
    /// A dimension `name=size`.
    pub fn new(name: impl Into<String>, size: usize) -> Self {
        Dim {
            name: name.into(),
            size,
        }
    }
}

impl<S: Into<String>> From<(S, usize)> for Dim {
    fn from((name, size): (S, usize)) -> Self {
        Dim::new(name, size)
    }
}

/// An ordered list of named dimensions over the ranks `offset .. offset + size`.
///
/// A grid is immutable once built and validated; see the crate docs for a worked example.
///
/// ```
/// use hypercomm_grid::Grid;
///
/// let grid = Grid::with_offset([("tp", 2), ("pp", 4)], 8)?;
/// assert_eq!(grid.size(), 8);
/// assert_eq!(grid.ranks(), 8..16);
/// assert_eq!(grid.coords(13)?, vec![1, 2]);
/// assert_eq!(grid.rank_of(&[1, 2])?, 13);
/// assert!(!grid.contains(16));
/// # Ok::<(), hypercomm_grid::GridError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "GridSpec", into = "GridSpec")]
pub struct Grid {
    dims: Vec<Dim>,
    strides: Vec<usize>,
    offset: usize,
    size: usize,
}

/// The serialized form of a grid: `{"dims":[{"name":"tp","size":2},...],"offset":0}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GridSpec {
    dims: Vec<Dim>,
    #[serde(default)]
    offset: usize,
}

impl TryFrom<GridSpec> for Grid {
    type Error = GridError;
    fn try_from(spec: GridSpec) -> Result<Self, GridError> {
        Grid::with_offset(spec.dims, spec.offset)
    }
}

impl From<Grid> for GridSpec {
    fn from(grid: Grid) -> Self {
        GridSpec {
            dims: grid.dims,
            offset: grid.offset,
        }
    }
}

impl Grid {
    /// A grid over ranks `0 .. Π sizes`.
    pub fn new<D: Into<Dim>>(dims: impl IntoIterator<Item = D>) -> Result<Grid, GridError> {
        Grid::with_offset(dims, 0)
    }

    /// A grid over ranks `offset .. offset + Π sizes`.
    ///
    /// Fails when there are no dimensions or more than [`MAX_DIMS`], a size is 0, a name is empty, repeated or not a
    /// single token, or the rank space overflows `usize`.
    pub fn with_offset<D: Into<Dim>>(
        dims: impl IntoIterator<Item = D>,
        offset: usize,
    ) -> Result<Grid, GridError> {
        let dims: Vec<Dim> = dims.into_iter().map(Into::into).collect();
        if dims.is_empty() {
            return Err(GridError::NoDims);
        }
        if dims.len() > MAX_DIMS {
            return Err(GridError::TooManyDims {
                count: dims.len(),
                max: MAX_DIMS,
            });
        }
        for (index, dim) in dims.iter().enumerate() {
            if dim.name.is_empty() {
                return Err(GridError::EmptyName { index });
            }
            if !dim
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(GridError::InvalidName {
                    name: dim.name.clone(),
                });
            }
            if dim.size == 0 {
                return Err(GridError::ZeroSize {
                    name: dim.name.clone(),
                });
            }
            if dims[..index].iter().any(|d| d.name == dim.name) {
                return Err(GridError::DuplicateName {
                    name: dim.name.clone(),
                });
            }
        }
        let overflow = || GridError::Overflow {
            dims: describe(&dims),
            offset,
        };
        let mut strides = Vec::with_capacity(dims.len());
        let mut size = 1usize;
        for dim in &dims {
            strides.push(size);
            size = size.checked_mul(dim.size).ok_or_else(overflow)?;
        }
        // The last rank, offset + size - 1, must be representable; size >= 1 here.
        offset.checked_add(size - 1).ok_or_else(overflow)?;
        Ok(Grid {
            dims,
            strides,
            offset,
            size,
        })
    }

    /// The dimensions, fastest-varying first.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// The stride of each dimension: how far apart two ranks are that differ by one along it.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The first rank.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The ranks this grid covers.
    pub fn ranks(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.size
    }

    /// Whether `rank` is one of this grid's ranks.
    pub fn contains(&self, rank: usize) -> bool {
        self.ranks().contains(&rank)
    }

    /// The position of the dimension called `name`.
    pub fn dim_index(&self, name: &str) -> Result<usize, GridError> {
        self.dims
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| GridError::UnknownDim {
                name: name.to_owned(),
                grid: self.to_string(),
            })
    }

    /// The size of the dimension called `name`.
    pub fn dim_size(&self, name: &str) -> Result<usize, GridError> {
        Ok(self.dims[self.dim_index(name)?].size)
    }

    /// The set of dimensions named in `names`, in any order. A name given twice is an error.
    ///
    /// ```
    /// # use hypercomm_grid::Grid;
    /// let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 4)])?;
    /// assert_eq!(grid.select(["dp", "cp"])?, grid.select(["cp", "dp"])?);
    /// assert!(grid.select(["ep"]).is_err());
    /// # Ok::<(), hypercomm_grid::GridError>(())
    /// ```
    pub fn select<S: AsRef<str>>(
        &self,
        names: impl IntoIterator<Item = S>,
    ) -> Result<DimSet, GridError> {
        let mut set = DimSet::EMPTY;
        for name in names {
            let name = name.as_ref();
            let index = self.dim_index(name)?;
            if set.contains(index) {
                return Err(GridError::DuplicateSelection {
                    name: name.to_owned(),
                });
            }
            set = set.with(index);
        }
        Ok(set)
    }

    /// Like [`Grid::select`], from tokens joined by `-` (`"dp-cp"`), as on the command line.
    pub fn select_joined(&self, joined: &str) -> Result<DimSet, GridError> {
        self.select(joined.split('-'))
    }

    /// The names of the dimensions in `set`, in grid order, joined by `-`.
    pub fn set_name(&self, set: DimSet) -> String {
        set.indices()
            .filter_map(|i| self.dims.get(i))
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join("-")
    }

    /// The coordinates of `rank`, one per dimension.
    pub fn coords(&self, rank: usize) -> Result<Vec<usize>, GridError> {
        let local = self.local(rank)?;
        Ok(self
            .dims
            .iter()
            .zip(&self.strides)
            .map(|(d, &s)| (local / s) % d.size)
            .collect())
    }

    /// The coordinate of `rank` along the dimension called `name`.
    pub fn coord(&self, rank: usize, name: &str) -> Result<usize, GridError> {
        let index = self.dim_index(name)?;
        Ok((self.local(rank)? / self.strides[index]) % self.dims[index].size)
    }

    /// The rank at `coords`; fails unless there is one coordinate per dimension, each below its size.
    pub fn rank_of(&self, coords: &[usize]) -> Result<usize, GridError> {
        if coords.len() != self.dims.len()
            || coords.iter().zip(&self.dims).any(|(&c, d)| c >= d.size)
        {
            return Err(GridError::BadCoords {
                coords: coords.to_vec(),
                grid: self.to_string(),
            });
        }
        Ok(self.offset
            + coords
                .iter()
                .zip(&self.strides)
                .map(|(c, s)| c * s)
                .sum::<usize>())
    }

    /// `rank - offset`, after checking that the grid contains `rank`.
    pub(crate) fn local(&self, rank: usize) -> Result<usize, GridError> {
        if !self.contains(rank) {
            return Err(GridError::RankOutOfRange {
                rank,
                start: self.offset,
                end: self.offset + self.size,
            });
        }
        Ok(rank - self.offset)
    }
}

/// Parses `name=size` pairs separated by commas (`tp=2,cp=2,dp=4`), as given on the command line.
///
/// ```
/// # use hypercomm_grid::{parse_dims, Dim};
/// assert_eq!(parse_dims("tp=2, dp=4")?, vec![Dim::new("tp", 2), Dim::new("dp", 4)]);
/// assert!(parse_dims("tp").is_err());
/// # Ok::<(), hypercomm_grid::GridError>(())
/// ```
pub fn parse_dims(text: &str) -> Result<Vec<Dim>, GridError> {
    let parse_err = |why: String| GridError::Parse {
        text: text.to_owned(),
        what: "dimensions (name=size,...)",
        why,
    };
    text.split(',')
        .map(|item| {
            let (name, size) = item
                .split_once('=')
                .ok_or_else(|| parse_err(format!("{item:?} is not name=size")))?;
            let size = size
                .trim()
                .parse::<usize>()
                .map_err(|e| parse_err(format!("size of {:?}: {e}", name.trim())))?;
            Ok(Dim::new(name.trim(), size))
        })
        .collect()
}

fn describe(dims: &[Dim]) -> String {
    dims.iter()
        .map(|d| format!("{}={}", d.name, d.size))
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Grid {
    /// `tp=2,pp=4`, followed by `@offset` when the offset is not 0.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(&self.dims))?;
        if self.offset != 0 {
            write!(f, "@{}", self.offset)?;
        }
        Ok(())
    }
}

impl FromStr for Grid {
    type Err = GridError;

    /// Parses the [`Display`](fmt::Display) form: `tp=2,cp=2,dp=4` with an optional `@offset`.
    fn from_str(text: &str) -> Result<Grid, GridError> {
        let parse_err = |why: String| GridError::Parse {
            text: text.to_owned(),
            what: "a grid (name=size,...[@offset])",
            why,
        };
        let (dims_text, offset) = match text.split_once('@') {
            Some((dims, offset)) => (
                dims,
                offset
                    .trim()
                    .parse::<usize>()
                    .map_err(|e| parse_err(format!("offset {offset:?}: {e}")))?,
            ),
            None => (text, 0),
        };
        let dims = parse_dims(dims_text).map_err(|e| match e {
            GridError::Parse { why, .. } => parse_err(why),
            other => other,
        })?;
        Grid::with_offset(dims, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn construction_errors_name_the_bad_value() {
        assert_eq!(Grid::new(Vec::<Dim>::new()), Err(GridError::NoDims));
        assert_eq!(
            Grid::new([("tp", 2), ("pp", 0)]),
            Err(GridError::ZeroSize { name: "pp".into() })
        );
        assert_eq!(
            Grid::new([("tp", 2), ("", 2)]),
            Err(GridError::EmptyName { index: 1 })
        );
        assert_eq!(
            Grid::new([("tp", 2), ("tp", 2)]),
            Err(GridError::DuplicateName { name: "tp".into() })
        );
        assert_eq!(
            Grid::new([("d-p", 2)]),
            Err(GridError::InvalidName { name: "d-p".into() })
        );
        let err = Grid::new([("a", usize::MAX), ("b", 2)]).unwrap_err();
        assert!(matches!(err, GridError::Overflow { .. }), "{err}");
        let err = Grid::with_offset([("a", 2)], usize::MAX).unwrap_err();
        assert!(matches!(err, GridError::Overflow { .. }), "{err}");
        assert!(Grid::with_offset([("a", 2)], usize::MAX - 1).is_ok());
        let many: Vec<Dim> = (0..65).map(|i| Dim::new(format!("d{i}"), 1)).collect();
        assert!(matches!(
            Grid::new(many),
            Err(GridError::TooManyDims { count: 65, .. })
        ));
    }

    #[test]
    fn first_dimension_varies_fastest() {
        let grid = Grid::new([("tp", 2), ("cp", 3), ("dp", 4)]).unwrap();
        assert_eq!(grid.strides(), &[1, 2, 6]);
        assert_eq!(grid.coords(0).unwrap(), vec![0, 0, 0]);
        assert_eq!(grid.coords(1).unwrap(), vec![1, 0, 0]);
        assert_eq!(grid.coords(2).unwrap(), vec![0, 1, 0]);
        assert_eq!(grid.coords(23).unwrap(), vec![1, 2, 3]);
        assert_eq!(grid.coord(23, "cp").unwrap(), 2);
    }

    #[test]
    fn offset_shifts_every_rank() {
        let grid = Grid::with_offset([("tp", 2), ("pp", 2)], 100).unwrap();
        assert_eq!(grid.ranks(), 100..104);
        assert_eq!(grid.rank_of(&[1, 1]).unwrap(), 103);
        assert_eq!(
            grid.coords(99),
            Err(GridError::RankOutOfRange {
                rank: 99,
                start: 100,
                end: 104
            })
        );
        assert!(grid.rank_of(&[2, 0]).is_err());
        assert!(grid.rank_of(&[0]).is_err());
    }

    #[test]
    fn display_and_parse_round_trip() {
        let grid = Grid::with_offset([("tp", 2), ("dp", 4)], 16).unwrap();
        assert_eq!(grid.to_string(), "tp=2,dp=4@16");
        assert_eq!(grid.to_string().parse::<Grid>().unwrap(), grid);
        assert_eq!("tp=2, pp=4".parse::<Grid>().unwrap().size(), 8);
        assert!(matches!(
            "tp2".parse::<Grid>(),
            Err(GridError::Parse { .. })
        ));
        assert!(matches!(
            "tp=x".parse::<Grid>(),
            Err(GridError::Parse { .. })
        ));
        assert!(matches!(
            "tp=0".parse::<Grid>(),
            Err(GridError::ZeroSize { .. })
        ));
    }

    #[test]
    fn serde_round_trip_validates() {
        let grid = Grid::with_offset([("tp", 2), ("dp", 4)], 8).unwrap();
        let json = serde_json::to_string(&grid).unwrap();
        assert_eq!(
            json,
            r#"{"dims":[{"name":"tp","size":2},{"name":"dp","size":4}],"offset":8}"#
        );
        assert_eq!(serde_json::from_str::<Grid>(&json).unwrap(), grid);
        let bad = r#"{"dims":[{"name":"tp","size":0}]}"#;
        let err = serde_json::from_str::<Grid>(bad).unwrap_err();
        assert!(err.to_string().contains("tp=0"), "{err}");
    }

    #[test]
    fn selection_is_order_insensitive_and_strict() {
        let grid = Grid::new([("tp", 2), ("cp", 2), ("dp", 2)]).unwrap();
        assert_eq!(
            grid.select(["dp", "tp"]).unwrap(),
            grid.select(["tp", "dp"]).unwrap()
        );
        assert_eq!(
            grid.select_joined("dp-tp").unwrap(),
            grid.select(["tp", "dp"]).unwrap()
        );
        assert_eq!(grid.set_name(grid.select(["dp", "tp"]).unwrap()), "tp-dp");
        assert_eq!(
            grid.select(["dp", "dp"]),
            Err(GridError::DuplicateSelection { name: "dp".into() })
        );
        assert!(matches!(
            grid.select(["ep"]),
            Err(GridError::UnknownDim { .. })
        ));
    }
}
