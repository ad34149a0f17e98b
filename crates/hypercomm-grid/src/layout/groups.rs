//! The groups of each [`GroupKind`] in a [`ParallelLayout`]: all of them streamed, or one rank's computed directly.
//!
//! Most kinds are groups of the decoder or the expert grid over a fixed set of dimensions. The rest derive from
//! those: embedding groups from pipeline groups, distributed-optimizer groups from data-parallel groups cut among
//! instances, hierarchical cp groups from cp split into levels.

use crate::layout::{GroupKind, LayoutError, ParallelLayout};
use crate::{CompactMembership, Grid, GroupRanks, Membership};

/// How a kind's groups are derived.
enum Source<'a> {
    /// Groups of `grid` over `dims`.
    Dims(&'a Grid, &'static [&'static str]),
    /// Groups of `grid` over `dims`, each cut into `parts` runs of consecutive members.
    Parts(&'a Grid, &'static [&'static str], usize),
    /// First and last member of each pipeline group.
    Embedding,
    /// First member of each pipeline group.
    PositionEmbedding,
    /// One group per level of the hierarchical cp grid.
    Hierarchical(&'a Grid),
}

/// Every group of one kind, streamed.
pub struct KindGroups {
    inner: Box<dyn Iterator<Item = Vec<usize>> + Send>,
    left: usize,
}

impl Iterator for KindGroups {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let next = self.inner.next()?;
        self.left -= 1;
        Some(next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for KindGroups {}

impl std::fmt::Debug for KindGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindGroups")
            .field("left", &self.left)
            .finish()
    }
}

impl KindGroups {
    fn new(inner: impl ExactSizeIterator<Item = Vec<usize>> + Send + 'static) -> KindGroups {
        let left = inner.len();
        KindGroups {
            inner: Box::new(inner),
            left,
        }
    }
}

impl ParallelLayout {
    /// Whether this layout has groups of `kind`: all kinds except `expt_dp_ag` when ep = 1, `hcp` without
    /// hierarchical cp sizes, and `inter_dist_opt` with one distributed-optimizer instance.
    pub fn has(&self, kind: GroupKind) -> bool {
        self.check(kind).is_ok()
    }

    /// The kinds this layout has, in `ProcessGroupCollection` field order.
    pub fn kinds(&self) -> Vec<GroupKind> {
        GroupKind::ALL
            .into_iter()
            .filter(|&k| self.has(k))
            .collect()
    }

    fn check(&self, kind: GroupKind) -> Result<(), LayoutError> {
        let why = match kind {
            GroupKind::ExptDpAg if self.config.ep == 1 => "expt_dp_ag exists only when ep > 1",
            GroupKind::Hcp if self.hcp.is_none() => {
                "hcp exists only when hierarchical cp sizes are given"
            }
            GroupKind::InterDistOpt if self.config.dist_opt_instances == 1 => {
                "inter_dist_opt exists only when there is more than one distributed-optimizer instance"
            }
            _ => return Ok(()),
        };
        Err(LayoutError::KindAbsent {
            kind: kind.name(),
            why,
        })
    }

    fn source(&self, kind: GroupKind) -> Result<Source<'_>, LayoutError> {
        self.check(kind)?;
        let decoder = &self.decoder;
        let expert = self.expert.grid();
        let split = &self.expert_split;
        Ok(match kind {
            GroupKind::Tp => Source::Dims(decoder, &["tp"]),
            GroupKind::Pp => Source::Dims(decoder, &["pp"]),
            GroupKind::Mp => Source::Dims(decoder, &["tp", "pp"]),
            GroupKind::Embd => Source::Embedding,
            GroupKind::PosEmbd => Source::PositionEmbedding,
            GroupKind::Cp => Source::Dims(decoder, &["cp"]),
            GroupKind::TpCp => Source::Dims(decoder, &["tp", "cp"]),
            GroupKind::Hcp => match &self.hcp {
                Some(grid) => Source::Hierarchical(grid),
                None => unreachable!("check() rejects hcp without hierarchical sizes"),
            },
            GroupKind::TpDpCp => Source::Dims(decoder, &["tp", "dp", "cp"]),
            GroupKind::Dp => Source::Dims(decoder, &["dp"]),
            GroupKind::DpCp | GroupKind::DpCpAg => Source::Dims(decoder, &["dp", "cp"]),
            GroupKind::IntraDpCp => {
                Source::Parts(decoder, &["dp", "cp"], self.config.dist_opt_instances)
            }
            GroupKind::Ep => Source::Dims(expert, &["ep"]),
            GroupKind::ExptTp => Source::Dims(expert, &["tp"]),
            GroupKind::TpEp => Source::Dims(expert, &["tp", "ep"]),
            GroupKind::TpEpPp => Source::Dims(expert, &["tp", "ep", "pp"]),
            GroupKind::ExptDp | GroupKind::ExptDpAg => Source::Dims(expert, &["dp"]),
            GroupKind::IntraExptDp => Source::Dims(split, &["dp_intra"]),
            GroupKind::InterDistOpt => Source::Dims(split, &["dp_inter"]),
            GroupKind::IntraDistOpt => Source::Dims(split, &["tp", "cp", "ep", "dp_intra", "pp"]),
        })
    }

    /// Every group of `kind`, streamed. For `hcp`, the groups of level 0, then level 1, and so on.
    pub fn groups(&self, kind: GroupKind) -> Result<KindGroups, LayoutError> {
        Ok(match self.source(kind)? {
            Source::Dims(grid, dims) => KindGroups::new(grid.groups(dims)?),
            Source::Parts(grid, dims, parts) => {
                KindGroups::new(grid.group_parts_in(grid.select(dims)?, parts)?)
            }
            Source::Embedding => KindGroups::new(self.decoder.groups(["pp"])?.map(|g| {
                let (first, last) = (g[0], g[g.len() - 1]);
                if first == last {
                    vec![first]
                } else {
                    vec![first, last]
                }
            })),
            Source::PositionEmbedding => {
                KindGroups::new(self.decoder.groups(["pp"])?.map(|g| vec![g[0]]))
            }
            Source::Hierarchical(grid) => {
                let levels = hcp_level_sets(grid, self.hcp_levels())?;
                let count = levels.iter().map(|&set| grid.groups_in(set).len()).sum();
                let grid = grid.clone();
                let all = levels.into_iter().flat_map(move |set| grid.groups_in(set));
                KindGroups {
                    inner: Box::new(all),
                    left: count,
                }
            }
        })
    }

    /// The `hcp` groups of one level, streamed ([`groups`](Self::groups) yields every level, one after another).
    ///
    /// ```
    /// use hypercomm_grid::layout::LayoutConfig;
    ///
    /// // cp 4 split into levels of 2 and 2.
    /// let layout = LayoutConfig::new(4).cp(4).hcp_sizes(vec![2, 2]).build()?;
    /// assert_eq!(layout.hcp_groups(0)?.collect::<Vec<_>>(), [[0, 1], [2, 3]]);
    /// assert_eq!(layout.hcp_groups(1)?.collect::<Vec<_>>(), [[0, 2], [1, 3]]);
    /// assert!(layout.hcp_groups(2).is_err());
    /// # Ok::<(), hypercomm_grid::layout::LayoutError>(())
    /// ```
    pub fn hcp_groups(&self, level: usize) -> Result<KindGroups, LayoutError> {
        let Source::Hierarchical(grid) = self.source(GroupKind::Hcp)? else {
            unreachable!("hcp's source is always hierarchical");
        };
        let levels = hcp_level_sets(grid, self.hcp_levels())?;
        let set = *levels.get(level).ok_or(LayoutError::NoSuchLevel {
            kind: GroupKind::Hcp.name(),
            level,
            levels: levels.len(),
        })?;
        let count = grid.groups_in(set).len();
        Ok(KindGroups {
            inner: Box::new(grid.groups_in(set)),
            left: count,
        })
    }

    /// `rank`'s `hcp` group at `level`, computed directly.
    pub fn hcp_group_of(&self, rank: usize, level: usize) -> Result<Membership, LayoutError> {
        let levels = self.hcp_levels();
        self.memberships(rank, GroupKind::Hcp)?
            .into_iter()
            .nth(level)
            .ok_or(LayoutError::NoSuchLevel {
                kind: GroupKind::Hcp.name(),
                level,
                levels,
            })
    }

    /// The number of hierarchical cp levels (0 without hierarchical cp sizes).
    pub fn hcp_levels(&self) -> usize {
        self.config.hcp_sizes.as_ref().map_or(0, Vec::len)
    }

    /// `rank`'s group of `kind`, computed directly without enumerating other groups; `None` when the rank is in
    /// no group of that kind (`embd` and `pos_embd` leave out middle pipeline stages).
    ///
    /// `hcp` has one group per level: ask [`ParallelLayout::memberships`] for it.
    pub fn group_of(
        &self,
        rank: usize,
        kind: GroupKind,
    ) -> Result<Option<Membership>, LayoutError> {
        if kind == GroupKind::Hcp {
            self.check(kind)?;
            return Err(LayoutError::MultiLevel { kind: kind.name() });
        }
        Ok(self.memberships(rank, kind)?.pop())
    }

    /// Every group of `kind` that holds `rank`: none or one for most kinds, one per level for `hcp`.
    pub fn memberships(
        &self,
        rank: usize,
        kind: GroupKind,
    ) -> Result<Vec<Membership>, LayoutError> {
        Ok(self
            .compact_memberships(rank, kind)?
            .iter()
            .map(CompactMembership::to_membership)
            .collect())
    }

    /// [`ParallelLayout::memberships`] with the members described, not listed: O(dims) time and space per group,
    /// whatever the world size, even for groups that span the world.
    ///
    /// ```
    /// use hypercomm_grid::layout::{GroupKind, LayoutConfig};
    ///
    /// let layout = LayoutConfig::new(1 << 40).tp(8).cp(2).ep(8).pp(16).build()?;
    /// let intra = layout.compact_memberships(777, GroupKind::IntraDistOpt)?;
    /// assert_eq!(intra[0].ranks.len(), 1 << 40);
    /// let tp = &layout.compact_memberships(777, GroupKind::Tp)?[0];
    /// assert_eq!(tp.ranks.iter().collect::<Vec<_>>(), (776..784).collect::<Vec<_>>());
    /// # Ok::<(), hypercomm_grid::layout::LayoutError>(())
    /// ```
    pub fn compact_memberships(
        &self,
        rank: usize,
        kind: GroupKind,
    ) -> Result<Vec<CompactMembership>, LayoutError> {
        Ok(match self.source(kind)? {
            Source::Dims(grid, dims) => vec![grid.compact_group_of_in(rank, grid.select(dims)?)?],
            Source::Parts(grid, dims, parts) => {
                vec![grid.compact_group_part_of(rank, grid.select(dims)?, parts)?]
            }
            Source::Embedding | Source::PositionEmbedding => {
                let pp = self
                    .decoder
                    .compact_group_of_in(rank, self.decoder.select(["pp"])?)?;
                let last = pp.ranks.len() - 1;
                let (first_rank, last_rank) = match (pp.ranks.get(0), pp.ranks.get(last)) {
                    (Some(first), Some(last)) => (first, last),
                    _ => unreachable!("a pipeline group has at least one member"),
                };
                // First and last stage: base `first_rank` and one axis of two positions `last - first` apart.
                let axes = match kind {
                    GroupKind::Embd if pp.index == 0 || pp.index == last => {
                        if last == 0 {
                            Vec::new()
                        } else {
                            vec![(last_rank - first_rank, 2)]
                        }
                    }
                    GroupKind::PosEmbd if pp.index == 0 => Vec::new(),
                    _ => return Ok(Vec::new()),
                };
                let len = if axes.is_empty() { 1 } else { 2 };
                vec![CompactMembership {
                    ranks: GroupRanks::new(first_rank, axes, 0, len),
                    index: usize::from(pp.index != 0),
                    group: pp.group,
                }]
            }
            Source::Hierarchical(grid) => hcp_level_sets(grid, self.hcp_levels())?
                .into_iter()
                .map(|set| grid.compact_group_of_in(rank, set))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// The dimension set of each hierarchical cp level (`hcp0`, `hcp1`, ...) in the hcp grid.
fn hcp_level_sets(grid: &Grid, levels: usize) -> Result<Vec<crate::DimSet>, LayoutError> {
    (0..levels)
        .map(|level| Ok(grid.select([format!("hcp{level}")])?))
        .collect()
}
