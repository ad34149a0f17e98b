//! [`Placement`]: which ranks of a layout hold which shard of a parameter, worked out from the layout's grids.
//!
//! A dense parameter lives on the decoder grid, an expert's on the expert grid (where `tp` is `etp`). Its holders
//! of shard `t` are the ranks whose `tp` coordinate is `t` (any, when replicated), whose `pp` coordinate is one
//! of its stages and, for an expert, whose `ep` coordinate owns the expert; every other coordinate varies.

use std::collections::BTreeMap;
use std::rc::Rc;

use hypercomm_grid::Grid;
use hypercomm_grid::layout::ParallelLayout;

use crate::{ParamSharding, RefitError, Sharding};

/// Where one parameter lives on a layout.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_refit::{DType, ParamSharding, Place, Sharding, Split};
///
/// // tp 2, pp 2, dp 2: a column-parallel weight of layer 3 of 4 lives on stage 1, shard t on the ranks with tp t.
/// let layout = LayoutConfig::new(8).tp(2).pp(2).build()?;
/// let mut sharding = Sharding::new(4, 0);
/// sharding.push(ParamSharding::new("qkv", [96, 32], DType::Bf16, Split::COLUMN, Place::Layer(3)));
/// let placement = sharding.placement(&sharding.params[0], &layout)?;
/// assert_eq!(placement.parts, 2);
/// assert_eq!(placement.holders, [vec![4, 6], vec![5, 7]]);
/// assert_eq!(placement.shard_of(7), Some(1));
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The number of shards: the tensor-parallel size (`etp` for an expert's parameter) when split, 1 when
    /// replicated.
    pub parts: u64,
    /// `holders[t]`: the ranks holding shard `t`, ascending.
    pub holders: Vec<Vec<usize>>,
}

impl Placement {
    /// The shard `rank` holds, if any.
    pub fn shard_of(&self, rank: usize) -> Option<u64> {
        self.holders
            .iter()
            .position(|ranks| ranks.binary_search(&rank).is_ok())
            .map(|t| t as u64)
    }
}

impl Sharding {
    /// Where `param` (one of this sharding's parameters) lives on `layout`. Fails when the layout does not fit it:
    /// a stage it lacks, a tensor-parallel size that does not divide the split dimension, experts that do not
    /// split over its ep.
    pub fn placement(
        &self,
        param: &ParamSharding,
        layout: &ParallelLayout,
    ) -> Result<Placement, RefitError> {
        let key = Key::of(self, param, layout)?;
        let holders = key.holders(layout)?;
        Ok(Placement {
            parts: key.parts(param, layout)?,
            holders,
        })
    }
}

/// What a parameter's holders depend on: its grid, whether it is split, its stages and its expert's owner.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    expert_owner: Option<usize>,
    split: bool,
    stages: Vec<usize>,
}

impl Key {
    fn of(
        sharding: &Sharding,
        param: &ParamSharding,
        layout: &ParallelLayout,
    ) -> Result<Key, RefitError> {
        Ok(Key {
            expert_owner: param
                .expert
                .map(|e| sharding.expert_owner(param, e, layout))
                .transpose()?,
            split: param.split.dim_blocks().is_some(),
            stages: sharding.stages(param, layout)?,
        })
    }

    fn grid<'a>(&self, layout: &'a ParallelLayout) -> &'a Grid {
        match self.expert_owner {
            Some(_) => layout.expert(),
            None => layout.decoder(),
        }
    }

    fn parts(&self, param: &ParamSharding, layout: &ParallelLayout) -> Result<u64, RefitError> {
        param.parts(self.grid(layout).dim_size("tp")?)
    }

    fn holders(&self, layout: &ParallelLayout) -> Result<Vec<Vec<usize>>, RefitError> {
        let grid = self.grid(layout);
        let mut fixed = vec!["pp"];
        if self.split {
            fixed.push("tp");
        }
        if self.expert_owner.is_some() {
            fixed.push("ep");
        }
        let free: Vec<&str> = grid
            .dims()
            .iter()
            .map(|d| d.name.as_str())
            .filter(|name| !fixed.contains(name))
            .collect();
        let shards = if self.split { grid.dim_size("tp")? } else { 1 };
        (0..shards)
            .map(|t| {
                let mut ranks = Vec::new();
                for &stage in &self.stages {
                    let mut coords = vec![0; grid.dims().len()];
                    coords[grid.dim_index("pp")?] = stage;
                    if self.split {
                        coords[grid.dim_index("tp")?] = t;
                    }
                    if let Some(owner) = self.expert_owner {
                        coords[grid.dim_index("ep")?] = owner;
                    }
                    let base = grid.rank_of(&coords)?;
                    if free.is_empty() {
                        ranks.push(base);
                    } else {
                        ranks.extend(grid.group_of(base, &free)?.members);
                    }
                }
                ranks.sort_unstable();
                ranks.dedup();
                Ok(ranks)
            })
            .collect()
    }
}

/// Placements of one sharding's parameters on one layout, sharing the holder lists of parameters that live on
/// the same ranks (every layer's norms, say), so that a model of thousands of parameters on thousands of ranks
/// enumerates each set of holders once.
pub(crate) struct Placer<'a> {
    layout: &'a ParallelLayout,
    sharding: &'a Sharding,
    cache: BTreeMap<Key, Rc<Vec<Vec<usize>>>>,
}

/// A placement whose holder lists are shared with the [`Placer`]'s cache.
pub(crate) struct SharedPlacement {
    pub(crate) parts: u64,
    pub(crate) holders: Rc<Vec<Vec<usize>>>,
}

impl<'a> Placer<'a> {
    pub(crate) fn new(layout: &'a ParallelLayout, sharding: &'a Sharding) -> Placer<'a> {
        Placer {
            layout,
            sharding,
            cache: BTreeMap::new(),
        }
    }

    pub(crate) fn place(&mut self, param: &ParamSharding) -> Result<SharedPlacement, RefitError> {
        let key = Key::of(self.sharding, param, self.layout)?;
        let parts = key.parts(param, self.layout)?;
        let holders = match self.cache.get(&key) {
            Some(holders) => Rc::clone(holders),
            None => {
                let holders = Rc::new(key.holders(self.layout)?);
                self.cache.insert(key, Rc::clone(&holders));
                holders
            }
        };
        Ok(SharedPlacement { parts, holders })
    }
}

#[cfg(test)]
mod tests {
    use hypercomm_grid::layout::LayoutConfig;

    use super::*;
    use crate::{DType, Place, Split};

    #[test]
    fn replicated_parameters_live_on_every_rank_of_their_stages() {
        let layout = LayoutConfig::new(16).tp(2).pp(4).build().unwrap();
        let mut s = Sharding::new(4, 0);
        s.push(ParamSharding::new(
            "emb",
            [8, 2],
            DType::Bf16,
            Split::VOCAB,
            Place::FirstAndLast,
        ));
        s.push(ParamSharding::new(
            "norm",
            [2],
            DType::Bf16,
            Split::Replicated,
            Place::Last,
        ));
        let emb = s.placement(&s.params[0], &layout).unwrap();
        assert_eq!(emb.holders, [vec![0, 2, 12, 14], vec![1, 3, 13, 15]]);
        let norm = s.placement(&s.params[1], &layout).unwrap();
        assert_eq!(norm.parts, 1);
        assert_eq!(norm.holders, [vec![12, 13, 14, 15]]);
        assert_eq!(norm.shard_of(11), None);
    }

    #[test]
    fn experts_live_on_their_owner_of_the_expert_grid() {
        // 8 ranks, tp 2, ep 4, etp 1: expert dp 2; 8 experts, two per ep rank.
        let layout = LayoutConfig::new(8).tp(2).ep(4).etp(1).build().unwrap();
        let mut s = Sharding::new(1, 8);
        s.push(
            ParamSharding::new("e5", [4, 2], DType::F32, Split::COLUMN, Place::Layer(0))
                .of_expert(5),
        );
        let p = s.placement(&s.params[0], &layout).unwrap();
        assert_eq!(p.parts, 1, "etp 1: one shard");
        // Expert grid tp(1)-cp-ep-dp-pp: ep rank 2 is ranks 2 and 6.
        assert_eq!(p.holders, [vec![2, 6]]);
        let odd = LayoutConfig::new(8).ep(8).build().unwrap();
        let mut s = Sharding::new(1, 4);
        s.push(
            ParamSharding::new("e", [4], DType::F32, Split::Replicated, Place::First).of_expert(1),
        );
        assert!(matches!(
            s.placement(&s.params[0], &odd),
            Err(RefitError::ExpertsNotDivisible { .. })
        ));
    }

    #[test]
    fn placer_shares_holders_and_agrees_with_placement() {
        let layout = LayoutConfig::new(8).tp(2).pp(2).build().unwrap();
        let mut s = Sharding::new(2, 0);
        for l in 0..2 {
            s.push(ParamSharding::new(
                format!("l{l}.w"),
                [4, 4],
                DType::F32,
                Split::ROW,
                Place::Layer(l),
            ));
            s.push(ParamSharding::new(
                format!("l{l}.n"),
                [4],
                DType::F32,
                Split::Replicated,
                Place::Layer(l),
            ));
        }
        let mut placer = Placer::new(&layout, &s);
        for p in &s.params {
            let shared = placer.place(p).unwrap();
            let direct = s.placement(p, &layout).unwrap();
            assert_eq!(
                (shared.parts, &*shared.holders),
                (direct.parts, &direct.holders)
            );
        }
        assert_eq!(placer.cache.len(), 4);
    }
}
