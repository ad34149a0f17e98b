//! The plan of a collection on one rank: every group slot, in one order shared by all ranks, and the rank's
//! membership in each.
//!
//! All ranks list the same slots in the same order (layout kinds in `ProcessGroupCollection` field order, one slot
//! per hierarchical cp level, then custom kinds, then extra tagged twins). Creating groups slot by slot in that order
//! cannot deadlock: a rank waiting on a group waits only for members that have finished every earlier slot.

use hypercomm_grid::layout::{GroupKind, ParallelLayout};
use hypercomm_grid::{DimSet, Grid, Membership};

use crate::CollectionError;
use crate::group_id::GroupId;

/// A kind of group the user defines beside (or instead of) a layout.
#[derive(Debug, Clone)]
pub enum CustomGroups {
    /// The groups of a grid over some of its dimensions.
    Grid {
        /// The grid.
        grid: Grid,
        /// The dimensions.
        dims: DimSet,
    },
    /// Explicit rank lists (disjoint; ranks in no list join no group of this kind).
    Explicit(Vec<Vec<usize>>),
}

/// One slot of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub id: GroupId,
    /// This rank's membership, or why it has none.
    pub membership: Result<Membership, &'static str>,
}

/// Everything a collection is built from, before any communicator exists.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    pub layout: Option<ParallelLayout>,
    pub custom: Vec<(String, CustomGroups)>,
    pub all_gather_groups: bool,
    /// Extra tagged communicators: (kind, tag).
    pub tagged: Vec<(String, String)>,
}

impl Topology {
    /// The kind names this topology offers, in slot order.
    pub fn kind_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .layout_kinds()
            .into_iter()
            .map(|k| k.name().to_owned())
            .collect();
        names.extend(self.custom.iter().map(|(n, _)| n.clone()));
        names
    }

    pub(crate) fn layout_kinds(&self) -> Vec<GroupKind> {
        let Some(layout) = &self.layout else {
            return Vec::new();
        };
        layout
            .kinds()
            .into_iter()
            .filter(|k| {
                self.all_gather_groups || !matches!(k, GroupKind::DpCpAg | GroupKind::ExptDpAg)
            })
            .collect()
    }

    /// Checks names and explicit lists; `collection` names the collection in errors.
    pub fn validate(&self, collection: &str) -> Result<(), CollectionError> {
        let invalid = |what: String| CollectionError::Invalid {
            collection: collection.to_owned(),
            what,
        };
        let layout_names: Vec<&str> = GroupKind::ALL.iter().map(|k| k.name()).collect();
        for (i, (name, groups)) in self.custom.iter().enumerate() {
            if name.is_empty() || layout_names.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "custom group kind {name:?} is empty or the name of a layout kind"
                )));
            }
            if self.custom[..i].iter().any(|(n, _)| n == name) {
                return Err(invalid(format!(
                    "custom group kind {name} is defined twice"
                )));
            }
            if let CustomGroups::Explicit(lists) = groups {
                let mut seen = std::collections::BTreeSet::new();
                for list in lists {
                    if list.is_empty() {
                        return Err(invalid(format!(
                            "custom group kind {name} has an empty group"
                        )));
                    }
                    for &rank in list {
                        if !seen.insert(rank) {
                            return Err(invalid(format!(
                                "custom group kind {name} lists rank {rank} in more than one group"
                            )));
                        }
                    }
                }
            }
        }
        let kinds = self.kind_names();
        for (kind, tag) in &self.tagged {
            if tag.is_empty() {
                return Err(invalid(format!(
                    "an extra {kind} communicator needs a non-empty tag"
                )));
            }
            if !kinds.contains(kind) {
                return Err(invalid(format!(
                    "extra communicator {kind}#{tag}: no group kind {kind} (this collection has: {})",
                    kinds.join(", ")
                )));
            }
        }
        let mut tags = self.tagged.clone();
        tags.sort();
        if let Some(w) = tags.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!(
                "extra communicator {}#{} is requested twice",
                w[0].0, w[0].1
            )));
        }
        Ok(())
    }

    /// Every slot with `rank`'s membership.
    pub fn plan(&self, rank: usize, collection: &str) -> Result<Vec<Slot>, CollectionError> {
        let layout_err = |source| CollectionError::Layout {
            collection: collection.to_owned(),
            source,
        };
        let mut slots = Vec::new();
        if let Some(layout) = &self.layout {
            for kind in self.layout_kinds() {
                let memberships = layout.memberships(rank, kind).map_err(layout_err)?;
                if kind == GroupKind::Hcp {
                    slots.extend(memberships.into_iter().enumerate().map(|(level, m)| Slot {
                        id: GroupId::hcp(level),
                        membership: Ok(m),
                    }));
                    continue;
                }
                let why = match kind {
                    GroupKind::Embd => {
                        "embedding groups hold only the first and last pipeline stage"
                    }
                    _ => "position-embedding groups hold only the first pipeline stage",
                };
                slots.push(Slot {
                    id: GroupId::kind(kind.name()),
                    membership: memberships.into_iter().next().ok_or(why),
                });
            }
        }
        for (name, groups) in &self.custom {
            slots.push(Slot {
                id: GroupId::kind(name.clone()),
                membership: custom_membership(groups, rank),
            });
        }
        for (kind, tag) in &self.tagged {
            let primary = slots
                .iter()
                .filter(|s| s.id.kind == *kind && s.id.tag.is_empty())
                .map(|s| s.membership.clone())
                .collect::<Vec<_>>();
            for (level, membership) in primary.into_iter().enumerate() {
                slots.push(Slot {
                    id: GroupId {
                        kind: kind.clone(),
                        level,
                        tag: tag.clone(),
                    },
                    membership,
                });
            }
        }
        Ok(slots)
    }
}

fn custom_membership(groups: &CustomGroups, rank: usize) -> Result<Membership, &'static str> {
    match groups {
        CustomGroups::Grid { grid, dims } => {
            if !grid.contains(rank) {
                return Err("the rank is outside this kind's grid");
            }
            // The grid contains the rank, so group_of cannot fail.
            grid.group_of_in(rank, *dims)
                .map_err(|_| "the rank is outside this kind's grid")
        }
        CustomGroups::Explicit(lists) => lists
            .iter()
            .enumerate()
            .find_map(|(group, list)| {
                list.iter()
                    .position(|&r| r == rank)
                    .map(|index| Membership {
                        members: list.clone(),
                        index,
                        group,
                    })
            })
            .ok_or("no group of this kind lists the rank"),
    }
}
