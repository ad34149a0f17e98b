//! [`Sharding`]: a model's parameters and how each is laid out on any layout: split along a dimension over the
//! tensor-parallel ranks or replicated, on which pipeline stages, of which expert; replicated along dp and cp.
//!
//! A sharding does not name a layout. Placement by layer ([`Place::Layer`]) and the owner of each expert are
//! worked out against the layout a plan is made for, so one sharding serves a trainer with pp 4 and an inference
//! engine with pp 1 alike:
//!
//! - A split parameter is cut into `tp` shards along [`Split::Tp`]'s `dim` (`etp` shards for an expert's); the
//!   rank with tensor-parallel coordinate `t` holds shard `t`.
//! - It lives on the stages of its [`Place`]: layer `l` of `L` on stage `l / (L / pp)` (Megatron's even split),
//!   the embedding on the first, the output layer on the last, a tied embedding on both.
//! - An expert's parameter lives on expert-parallel rank `expert / (experts / ep)` of the expert grid.
//! - Every other coordinate (dp, cp, and expert dp) holds a replica.
//!
//! Parameters are named as the model names them; a refit matches source and destination parameters by name.

use hypercomm_grid::layout::ParallelLayout;
use serde::{Deserialize, Serialize};

use crate::{DType, RefitError};

/// How a parameter is split over the tensor-parallel ranks.
///
/// Megatron's weights are `[out, in]`: column-parallel layers (`linear_qkv`, `linear_fc1`, the output layer)
/// split dim 0 and their bias too, row-parallel layers (`linear_proj`, `linear_fc2`) split dim 1 and replicate
/// their bias, the vocab-parallel embedding `[vocab, hidden]` splits dim 0, and norms are replicated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Every tensor-parallel rank holds the whole tensor.
    Replicated,
    /// Split along `dim`: cut into `blocks` equal blocks, each cut into one part per tensor-parallel rank; a rank
    /// holds its part of every block, the blocks one after another (a gated MLP's `[gate; up]` weight has 2).
    Tp {
        /// The dimension split.
        dim: usize,
        /// Equal blocks along `dim`, each split over the ranks; 1 for a plain split.
        #[serde(default = "one")]
        blocks: u64,
    },
}

fn one() -> u64 {
    1
}

impl Split {
    /// Column-parallel weight `[out, in]` or bias `[out]`: split along dim 0.
    pub const COLUMN: Split = Split::Tp { dim: 0, blocks: 1 };
    /// Row-parallel weight `[out, in]`: split along dim 1.
    pub const ROW: Split = Split::Tp { dim: 1, blocks: 1 };
    /// Vocab-parallel embedding `[vocab, hidden]`: split along dim 0.
    pub const VOCAB: Split = Split::Tp { dim: 0, blocks: 1 };

    /// Column-parallel with `blocks` blocks along dim 0 (a gated `linear_fc1` has 2: gate and up).
    pub fn column_blocks(blocks: u64) -> Split {
        Split::Tp { dim: 0, blocks }
    }

    /// `(dim, blocks)` when split.
    pub(crate) fn dim_blocks(self) -> Option<(usize, u64)> {
        match self {
            Split::Replicated => None,
            Split::Tp { dim, blocks } => Some((dim, blocks)),
        }
    }
}

/// Which pipeline stages hold a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// The first stage (the embedding).
    First,
    /// The last stage (the final norm, the output layer).
    Last,
    /// The first and the last stage (an embedding tied to the output layer); one stage when pp = 1.
    FirstAndLast,
    /// The stage of transformer layer `l`: `l / (layers / pp)`.
    Layer(usize),
    /// An explicit stage, for uneven pipelines; it must exist in every layout the sharding is used with.
    Stage(usize),
}

/// One parameter: its name, full shape and element type, and how it is laid out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSharding {
    /// The parameter's name, unique in its sharding.
    pub name: String,
    /// The full (unsplit) shape, row-major; empty for a scalar.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// How it is split over the tensor-parallel ranks.
    #[serde(default = "replicated")]
    pub split: Split,
    /// Which pipeline stages hold it.
    pub place: Place,
    /// The expert it belongs to (`0 .. experts`), for an expert's parameter; laid out on the expert grid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert: Option<usize>,
}

fn replicated() -> Split {
    Split::Replicated
}

impl ParamSharding {
    /// A dense (non-expert) parameter.
    pub fn new(
        name: impl Into<String>,
        shape: impl Into<Vec<u64>>,
        dtype: DType,
        split: Split,
        place: Place,
    ) -> ParamSharding {
        ParamSharding {
            name: name.into(),
            shape: shape.into(),
            dtype,
            split,
            place,
            expert: None,
        }
    }

    /// The same parameter, belonging to `expert`.
    #[must_use]
    pub fn of_expert(mut self, expert: usize) -> ParamSharding {
        self.expert = Some(expert);
        self
    }

    /// The full tensor's size in bytes.
    pub fn bytes(&self) -> Result<u64, RefitError> {
        self.shape
            .iter()
            .try_fold(self.dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| RefitError::TooLarge {
                name: self.name.clone(),
                shape: self.shape.clone(),
            })
    }

    /// The number of shards on a layout whose tensor-parallel size (`etp` for an expert's parameter) is `tp`:
    /// `tp` when split, 1 when replicated. Fails when `tp · blocks` does not divide the split dimension.
    pub fn parts(&self, tp: usize) -> Result<u64, RefitError> {
        let Some((dim, blocks)) = self.split.dim_blocks() else {
            return Ok(1);
        };
        let bad_split = || RefitError::BadSplit {
            name: self.name.clone(),
            shape: self.shape.clone(),
            dim,
            blocks,
        };
        let size = *self.shape.get(dim).ok_or_else(bad_split)?;
        if blocks == 0 || tp == 0 {
            return Err(bad_split());
        }
        let tp64 = tp as u64;
        if tp64.checked_mul(blocks).is_none_or(|p| size % p != 0) {
            return Err(RefitError::NotDivisible {
                name: self.name.clone(),
                dim,
                size,
                tp,
                blocks,
            });
        }
        Ok(tp64)
    }

    /// The shape of one shard when split into `parts` shards (as [`ParamSharding::parts`] counts them; 0 counts
    /// as 1).
    pub fn local_shape(&self, parts: u64) -> Vec<u64> {
        let mut shape = self.shape.clone();
        if let Some((dim, _)) = self.split.dim_blocks()
            && let Some(size) = shape.get_mut(dim)
        {
            *size /= parts.max(1);
        }
        shape
    }

    /// Checks what needs no layout: a name, no zero dimension, a size that fits in 64 bits, a split dimension the
    /// parameter has and at least one block.
    fn check(&self, index: usize) -> Result<(), RefitError> {
        if self.name.is_empty() {
            return Err(RefitError::EmptyName { index });
        }
        if self.shape.contains(&0) {
            return Err(RefitError::ZeroDim {
                name: self.name.clone(),
                shape: self.shape.clone(),
            });
        }
        self.bytes()?;
        if let Some((dim, blocks)) = self.split.dim_blocks()
            && (dim >= self.shape.len() || blocks == 0 || self.shape[dim] % blocks != 0)
        {
            return Err(RefitError::BadSplit {
                name: self.name.clone(),
                shape: self.shape.clone(),
                dim,
                blocks,
            });
        }
        Ok(())
    }
}

/// A model's parameters and how each is laid out; see the module docs.
///
/// ```
/// use hypercomm_refit::{DType, ParamSharding, Place, Sharding, Split};
///
/// let mut sharding = Sharding::new(2, 0);
/// sharding.push(ParamSharding::new("embedding", [32000, 1024], DType::Bf16, Split::VOCAB, Place::First));
/// sharding.push(ParamSharding::new("layer1.fc2", [1024, 4096], DType::Bf16, Split::ROW, Place::Layer(1)));
/// sharding.check()?;
/// assert_eq!(sharding.bytes()?, 2 * (32000 * 1024 + 1024 * 4096));
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sharding {
    /// The number of transformer layers, for parameters placed by [`Place::Layer`].
    #[serde(default)]
    pub layers: usize,
    /// The number of experts per MoE layer, for experts' parameters.
    #[serde(default)]
    pub experts: usize,
    /// The parameters, in the model's order (plans keep it).
    pub params: Vec<ParamSharding>,
}

impl Sharding {
    /// An empty sharding of a model with `layers` transformer layers and `experts` experts per MoE layer.
    pub fn new(layers: usize, experts: usize) -> Sharding {
        Sharding {
            layers,
            experts,
            params: Vec::new(),
        }
    }

    /// Appends a parameter.
    pub fn push(&mut self, param: ParamSharding) {
        self.params.push(param);
    }

    /// Checks what needs no layout: names present and unique, shapes without zeros whose bytes fit in 64 bits,
    /// splits along existing dimensions, layers and experts within the model's counts.
    pub fn check(&self) -> Result<(), RefitError> {
        let mut names: Vec<&str> = Vec::with_capacity(self.params.len());
        for (index, param) in self.params.iter().enumerate() {
            param.check(index)?;
            names.push(&param.name);
            if let Place::Layer(layer) = param.place
                && layer >= self.layers
            {
                return Err(RefitError::LayerOutOfRange {
                    name: param.name.clone(),
                    layer,
                    layers: self.layers,
                });
            }
            if let Some(expert) = param.expert
                && expert >= self.experts
            {
                return Err(RefitError::ExpertOutOfRange {
                    name: param.name.clone(),
                    expert,
                    experts: self.experts,
                });
            }
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(RefitError::DuplicateParam {
                name: pair[0].to_owned(),
            });
        }
        Ok(())
    }

    /// The bytes of every full tensor together.
    pub fn bytes(&self) -> Result<u64, RefitError> {
        self.params.iter().try_fold(0u64, |acc, p| {
            acc.checked_add(p.bytes()?)
                .ok_or_else(|| RefitError::TooLarge {
                    name: p.name.clone(),
                    shape: p.shape.clone(),
                })
        })
    }

    /// The pipeline stages of `layout` that hold `param` (sorted, distinct).
    pub fn stages(
        &self,
        param: &ParamSharding,
        layout: &ParallelLayout,
    ) -> Result<Vec<usize>, RefitError> {
        let pp = layout.config().pp;
        let stage = |stage: usize| {
            if stage < pp {
                Ok(stage)
            } else {
                Err(RefitError::StageOutOfRange {
                    name: param.name.clone(),
                    stage,
                    pp,
                })
            }
        };
        Ok(match param.place {
            Place::First => vec![0],
            Place::Last => vec![pp - 1],
            Place::FirstAndLast if pp == 1 => vec![0],
            Place::FirstAndLast => vec![0, pp - 1],
            Place::Stage(s) => vec![stage(s)?],
            Place::Layer(layer) => {
                if layer >= self.layers {
                    return Err(RefitError::LayerOutOfRange {
                        name: param.name.clone(),
                        layer,
                        layers: self.layers,
                    });
                }
                if self.layers % pp != 0 {
                    return Err(RefitError::LayersNotDivisible {
                        name: param.name.clone(),
                        layers: self.layers,
                        pp,
                    });
                }
                vec![layer / (self.layers / pp)]
            }
        })
    }

    /// The expert-parallel rank of `layout` that holds expert `expert`: `expert / (experts / ep)`.
    pub fn expert_owner(
        &self,
        param: &ParamSharding,
        expert: usize,
        layout: &ParallelLayout,
    ) -> Result<usize, RefitError> {
        let ep = layout.config().ep;
        if expert >= self.experts {
            return Err(RefitError::ExpertOutOfRange {
                name: param.name.clone(),
                expert,
                experts: self.experts,
            });
        }
        if self.experts % ep != 0 {
            return Err(RefitError::ExpertsNotDivisible {
                name: param.name.clone(),
                experts: self.experts,
                ep,
            });
        }
        Ok(expert / (self.experts / ep))
    }
}

#[cfg(test)]
mod tests {
    use hypercomm_grid::layout::LayoutConfig;

    use super::*;

    fn param(name: &str, shape: &[u64], split: Split, place: Place) -> ParamSharding {
        ParamSharding::new(name, shape.to_vec(), DType::F32, split, place)
    }

    #[test]
    fn checks_name_the_bad_parameter() {
        let mut s = Sharding::new(2, 4);
        s.push(param("a", &[4, 4], Split::ROW, Place::Layer(1)));
        s.push(param("a", &[4], Split::Replicated, Place::First));
        assert_eq!(
            s.check(),
            Err(RefitError::DuplicateParam { name: "a".into() })
        );
        s.params[1].name = "b".into();
        s.params[1].shape = vec![4, 0];
        assert_eq!(
            s.check().unwrap_err().to_string(),
            "parameter \"b\" has shape [4, 0]: every dimension must be at least 1"
        );
        s.params[1] = param("b", &[4], Split::ROW, Place::First);
        assert_eq!(
            s.check().unwrap_err().to_string(),
            "parameter \"b\" of shape [4] cannot split dim 1 into 1 block(s)"
        );
        s.params[1] = param("b", &[4], Split::Replicated, Place::Layer(2));
        assert!(matches!(
            s.check(),
            Err(RefitError::LayerOutOfRange { layer: 2, .. })
        ));
        s.params[1] = param("b", &[4], Split::Replicated, Place::First).of_expert(4);
        assert_eq!(
            s.check().unwrap_err().to_string(),
            "parameter \"b\" belongs to expert 4, but the sharding has 4 experts"
        );
        s.params[1] = param("b", &[u64::MAX, 2], Split::Replicated, Place::First);
        assert!(matches!(s.check(), Err(RefitError::TooLarge { .. })));
        s.params[1].name = String::new();
        assert_eq!(s.check(), Err(RefitError::EmptyName { index: 1 }));
    }

    #[test]
    fn parts_need_the_tp_size_and_blocks_to_divide_the_dimension() {
        let fc1 = param("fc1", &[12, 4], Split::column_blocks(2), Place::First);
        assert_eq!(fc1.parts(3).unwrap(), 3);
        assert_eq!(fc1.local_shape(3), [4, 4]);
        assert_eq!(
            fc1.parts(4).unwrap_err().to_string(),
            "parameter \"fc1\": dim 0 of size 12 does not split into 4 tensor-parallel shard(s) of 2 block(s) each"
        );
        let norm = param("norm", &[5], Split::Replicated, Place::Last);
        assert_eq!(norm.parts(8).unwrap(), 1);
        assert_eq!(norm.local_shape(1), [5]);
    }

    #[test]
    fn stages_follow_megatron_even_split() {
        let layout = LayoutConfig::new(8).pp(4).build().unwrap();
        let s = Sharding::new(8, 0);
        let stages = |place| s.stages(&param("p", &[1], Split::Replicated, place), &layout);
        assert_eq!(stages(Place::First).unwrap(), [0]);
        assert_eq!(stages(Place::Last).unwrap(), [3]);
        assert_eq!(stages(Place::FirstAndLast).unwrap(), [0, 3]);
        assert_eq!(stages(Place::Layer(5)).unwrap(), [2]);
        assert_eq!(
            stages(Place::Stage(4)).unwrap_err().to_string(),
            "parameter \"p\" is placed on stage 4, but the layout has pp 4"
        );
        let single = LayoutConfig::new(1).build().unwrap();
        let p = param("p", &[1], Split::Replicated, Place::FirstAndLast);
        assert_eq!(s.stages(&p, &single).unwrap(), [0]);
        let uneven = Sharding::new(6, 0);
        let p = param("p", &[1], Split::Replicated, Place::Layer(0));
        assert_eq!(
            uneven.stages(&p, &layout).unwrap_err().to_string(),
            "6 layers do not split evenly over pp 4 (parameter \"p\" is placed by layer)"
        );
    }

    #[test]
    fn experts_split_evenly_over_ep() {
        let layout = LayoutConfig::new(8).ep(4).build().unwrap();
        let s = Sharding::new(1, 8);
        let p = param("e", &[2], Split::Replicated, Place::First);
        assert_eq!(s.expert_owner(&p, 5, &layout).unwrap(), 2);
        let odd = Sharding::new(1, 6);
        assert_eq!(
            odd.expert_owner(&p, 5, &layout).unwrap_err().to_string(),
            "6 experts do not split evenly over ep 4 (parameter \"e\")"
        );
    }

    #[test]
    fn serde_round_trip_with_defaults() {
        let json = r#"{"layers": 2, "params": [
            {"name": "w", "shape": [8, 4], "dtype": "bf16", "split": {"tp": {"dim": 1}}, "place": {"layer": 1}},
            {"name": "n", "shape": [4], "dtype": "f32", "place": "last"}
        ]}"#;
        let s: Sharding = serde_json::from_str(json).unwrap();
        assert_eq!(s.params[0].split, Split::ROW);
        assert_eq!(s.params[1].split, Split::Replicated);
        assert_eq!(s.experts, 0);
        let back: Sharding = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let bad = r#"{"params": [{"name": "w", "shape": [1], "dtype": "bf16", "place": "first", "splt": "replicated"}]}"#;
        let err = serde_json::from_str::<Sharding>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `splt`"), "{err}");
    }
}
