//! [`ShrunkLayout`]: the layout to rebuild on after losing ranks, by dropping whole data-parallel replicas.
//!
//! Tensor, pipeline and context parallelism split one model replica across ranks, so losing any rank of a replica
//! loses that replica; data parallelism only repeats replicas, so the job can go on with fewer of them. This keeps
//! every parallel size except `dp`, removes each replica that lost a rank, and renumbers the survivors densely in
//! the same order (a survivor keeps its tp, cp and pp coordinates; its dp coordinate closes the gap).
//!
//! Survivors that belonged to a dropped replica get no rank in the new layout: they sit out (or become spares).

use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};

use crate::CollectionError;

/// A layout with the data-parallel replicas that lost ranks removed, and where each old rank went.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use process_group_collection::ShrunkLayout;
///
/// // 8 ranks, tp=2, dp=4: replicas are [0,1], [2,3], [4,5], [6,7]. Rank 5 dies.
/// let layout = LayoutConfig::new(8).tp(2).build()?;
/// let shrunk = ShrunkLayout::without_replicas_of(&layout, &[5])?;
/// assert_eq!((shrunk.layout.world(), shrunk.layout.dp()), (6, 3));
/// assert_eq!(shrunk.dropped_replicas, [2]);
/// assert_eq!(shrunk.new_rank(4), None); // 5's tp partner sits out
/// assert_eq!(shrunk.new_rank(6), Some(4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ShrunkLayout {
    /// The smaller layout: the old configuration with `world` reduced by the dropped replicas.
    pub layout: ParallelLayout,
    /// The dp coordinates of the replicas that were dropped, ascending.
    pub dropped_replicas: Vec<usize>,
    /// For each rank of the old layout (index: rank minus the old offset), its rank in the new layout.
    new_ranks: Vec<Option<usize>>,
    old_offset: usize,
}

impl ShrunkLayout {
    /// Drops every data-parallel replica of `layout` that contains a rank in `lost`.
    ///
    /// Fails when a lost rank is outside the layout, when every replica is lost, or when the smaller layout
    /// breaks a layout rule (say, `dist_opt_instances` no longer divides `dp*cp`).
    pub fn without_replicas_of(
        layout: &ParallelLayout,
        lost: &[usize],
    ) -> Result<ShrunkLayout, CollectionError> {
        let config = layout.config();
        let fail = |what: String| {
            CollectionError::Rebuild(format!(
                "layout world={} tp={} pp={} cp={} dp={} losing ranks {lost:?}: {what}",
                layout.world(),
                config.tp,
                config.pp,
                config.cp,
                layout.dp()
            ))
        };
        let grid = layout.decoder();
        let mut dropped = Vec::new();
        for &rank in lost {
            let dp = grid
                .coord(rank, "dp")
                .map_err(|e| fail(format!("rank {rank}: {e}")))?;
            dropped.push(dp);
        }
        dropped.sort_unstable();
        dropped.dedup();
        let left = layout.dp() - dropped.len();
        if left == 0 {
            return Err(fail(format!(
                "every one of the {} data-parallel replicas lost a rank",
                layout.dp()
            )));
        }
        let replica = layout.world() / layout.dp();
        let smaller = LayoutConfig {
            world: left * replica,
            ..config.clone()
        }
        .build()
        .map_err(|e| fail(e.to_string()))?;
        let dp_dim = grid.dim_index("dp").map_err(|e| fail(e.to_string()))?;
        let new_grid = smaller.decoder();
        let new_ranks = grid
            .ranks()
            .map(|old| {
                let mut coords = grid.coords(old).map_err(|e| fail(e.to_string()))?;
                let d = coords[dp_dim];
                if dropped.binary_search(&d).is_ok() {
                    return Ok(None);
                }
                // Close the gaps left by the dropped replicas below this one.
                coords[dp_dim] = d - dropped.partition_point(|&x| x < d);
                new_grid
                    .rank_of(&coords)
                    .map(Some)
                    .map_err(|e| fail(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShrunkLayout {
            layout: smaller,
            dropped_replicas: dropped,
            new_ranks,
            old_offset: grid.offset(),
        })
    }

    /// The new rank of old rank `old`: `None` when its replica was dropped or it was not in the old layout.
    pub fn new_rank(&self, old: usize) -> Option<usize> {
        old.checked_sub(self.old_offset)
            .and_then(|i| self.new_ranks.get(i).copied().flatten())
    }

    /// The old ranks that keep a place, in new-rank order.
    pub fn survivors(&self) -> Vec<usize> {
        let mut kept: Vec<(usize, usize)> = self
            .new_ranks
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.map(|n| (n, i + self.old_offset)))
            .collect();
        kept.sort_unstable();
        kept.into_iter().map(|(_, old)| old).collect()
    }
}

#[cfg(test)]
mod tests {
    use hypercomm_grid::layout::GroupKind;

    use super::*;

    #[test]
    fn dropping_a_replica_keeps_every_survivors_model_coordinates() {
        // pp outermost: replicas interleave. tp=2, pp=2, dp=4 over 16 ranks.
        let layout = LayoutConfig::new(16).tp(2).pp(2).build().unwrap();
        let shrunk = ShrunkLayout::without_replicas_of(&layout, &[5, 4]).unwrap();
        let (old, new) = (layout.decoder(), shrunk.layout.decoder());
        assert_eq!(shrunk.layout.dp(), 3);
        assert_eq!(shrunk.dropped_replicas, vec![old.coord(5, "dp").unwrap()]);
        let survivors = shrunk.survivors();
        assert_eq!(survivors.len(), 12);
        for (new_rank, &o) in survivors.iter().enumerate() {
            assert_eq!(shrunk.new_rank(o), Some(new_rank));
            for dim in ["tp", "pp"] {
                assert_eq!(
                    old.coord(o, dim).unwrap(),
                    new.coord(new_rank, dim).unwrap()
                );
            }
            assert_ne!(old.coord(o, "dp").unwrap(), shrunk.dropped_replicas[0]);
        }
        // Every member of the dropped replica sits out, and so does nothing else.
        let out: Vec<usize> = (0..16).filter(|&r| shrunk.new_rank(r).is_none()).collect();
        assert_eq!(out.len(), 4);
        assert!(
            out.iter()
                .all(|&r| old.coord(r, "dp").unwrap() == shrunk.dropped_replicas[0])
        );
        // The new tp groups are the old ones, renumbered.
        for group in shrunk.layout.groups(GroupKind::Tp).unwrap() {
            let olds: Vec<usize> = group.iter().map(|&n| survivors[n]).collect();
            let m = layout.group_of(olds[0], GroupKind::Tp).unwrap().unwrap();
            assert_eq!(m.members, olds);
        }
    }

    #[test]
    fn impossible_rebuilds_say_why() {
        let layout = LayoutConfig::new(4).tp(2).build().unwrap();
        let all = ShrunkLayout::without_replicas_of(&layout, &[0, 3]).unwrap_err();
        assert!(all.to_string().contains("every one of the 2"), "{all}");
        let outside = ShrunkLayout::without_replicas_of(&layout, &[9]).unwrap_err();
        assert!(outside.to_string().contains("rank 9"), "{outside}");
        let instances = LayoutConfig::new(8)
            .tp(2)
            .dist_opt_instances(4)
            .build()
            .unwrap();
        let e = ShrunkLayout::without_replicas_of(&instances, &[1]).unwrap_err();
        assert!(e.to_string().contains("world=8 tp=2 pp=1 cp=1 dp=4"), "{e}");
    }
}
