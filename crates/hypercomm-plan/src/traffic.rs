//! [`Traffic`]: how many bytes each rank moves per training step in each kind of parallelism, given by the user or
//! derived from a [`ModelShape`], and the collective that moves them ([`Collective`]).
//!
//! A collective over `n` ranks moving a buffer of `B` bytes per rank over a ring or tree whose slowest link carries
//! `bw` bytes per second takes about `factor(n) · B / bw` ([`Collective::factor`]):
//!
//! | collective | factor(n) |
//! | --- | --- |
//! | all-reduce | 2(n−1)/n |
//! | reduce-scatter + all-gather | 2(n−1)/n |
//! | all-gather, reduce-scatter, all-to-all | (n−1)/n |
//! | pipeline send/receive | 1 (per adjacent pair) |

use std::fmt;

use hypercomm_grid::layout::{GroupKind, ParallelLayout};
use serde::{Deserialize, Serialize};

use crate::error::TopologyError;

/// How a kind of parallelism moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Every rank ends with the sum of every rank's buffer.
    AllReduce,
    /// Gradients reduce-scattered, then parameters all-gathered (the distributed optimizer).
    ReduceScatterAllGather,
    /// Every rank ends with every rank's buffer.
    AllGather,
    /// Every rank sends a slice of its buffer to every other rank.
    AllToAll,
    /// Each pipeline stage sends to the next and, backwards, to the previous.
    SendRecv,
}

impl Collective {
    /// The algorithm factor for `n` ranks: the bytes each rank moves over its slowest link per byte of its
    /// buffer. Zero for one rank.
    pub fn factor(self, n: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let part = (n - 1) as f64 / n as f64;
        match self {
            Collective::AllReduce | Collective::ReduceScatterAllGather => 2.0 * part,
            Collective::AllGather | Collective::AllToAll => part,
            Collective::SendRecv => 1.0,
        }
    }

    /// A short description for explanations.
    pub fn describe(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatterAllGather => "reduce-scatter + all-gather",
            Collective::AllGather => "all-gather",
            Collective::AllToAll => "all-to-all",
            Collective::SendRecv => "send/receive",
        }
    }
}

/// A kind of parallelism that carries traffic, with the group kind it uses and its collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrafficKind {
    /// Tensor parallelism: activations all-reduced in `tp` groups.
    Tp,
    /// Context parallelism: keys and values all-gathered in `cp` groups.
    Cp,
    /// Expert parallelism: tokens exchanged all-to-all in `ep` groups.
    Ep,
    /// Data parallelism: dense gradients reduce-scattered and parameters all-gathered in `dp_cp` groups.
    Dp,
    /// Expert data parallelism: expert gradients and parameters in `expt_dp` groups.
    ExptDp,
    /// Pipeline parallelism: activations sent between adjacent stages of `pp` groups.
    Pp,
}

impl TrafficKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [TrafficKind; 6] = [
        TrafficKind::Tp,
        TrafficKind::Cp,
        TrafficKind::Ep,
        TrafficKind::Dp,
        TrafficKind::ExptDp,
        TrafficKind::Pp,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            TrafficKind::Tp => "tp",
            TrafficKind::Cp => "cp",
            TrafficKind::Ep => "ep",
            TrafficKind::Dp => "dp",
            TrafficKind::ExptDp => "expt_dp",
            TrafficKind::Pp => "pp",
        }
    }

    /// The group kind whose groups carry this traffic.
    pub fn group_kind(self) -> GroupKind {
        match self {
            TrafficKind::Tp => GroupKind::Tp,
            TrafficKind::Cp => GroupKind::Cp,
            TrafficKind::Ep => GroupKind::Ep,
            TrafficKind::Dp => GroupKind::DpCp,
            TrafficKind::ExptDp => GroupKind::ExptDp,
            TrafficKind::Pp => GroupKind::Pp,
        }
    }

    /// The collective that moves this traffic.
    pub fn collective(self) -> Collective {
        match self {
            TrafficKind::Tp => Collective::AllReduce,
            TrafficKind::Cp => Collective::AllGather,
            TrafficKind::Ep => Collective::AllToAll,
            TrafficKind::Dp | TrafficKind::ExptDp => Collective::ReduceScatterAllGather,
            TrafficKind::Pp => Collective::SendRecv,
        }
    }
}

impl fmt::Display for TrafficKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes per rank per training step for each [`TrafficKind`]: the buffer size `B` of the collective formulas in
/// the module docs, summed over every call in the step.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Traffic {
    /// Tensor-parallel bytes.
    pub tp: f64,
    /// Context-parallel bytes.
    pub cp: f64,
    /// Expert-parallel bytes.
    pub ep: f64,
    /// Data-parallel bytes (dense gradients).
    pub dp: f64,
    /// Expert data-parallel bytes.
    pub expt_dp: f64,
    /// Pipeline bytes.
    pub pp: f64,
}

impl Traffic {
    /// The bytes of `kind`.
    pub fn bytes(&self, kind: TrafficKind) -> f64 {
        match kind {
            TrafficKind::Tp => self.tp,
            TrafficKind::Cp => self.cp,
            TrafficKind::Ep => self.ep,
            TrafficKind::Dp => self.dp,
            TrafficKind::ExptDp => self.expt_dp,
            TrafficKind::Pp => self.pp,
        }
    }

    fn bytes_mut(&mut self, kind: TrafficKind) -> &mut f64 {
        match kind {
            TrafficKind::Tp => &mut self.tp,
            TrafficKind::Cp => &mut self.cp,
            TrafficKind::Ep => &mut self.ep,
            TrafficKind::Dp => &mut self.dp,
            TrafficKind::ExptDp => &mut self.expt_dp,
            TrafficKind::Pp => &mut self.pp,
        }
    }

    /// The traffic of a model of `shape` trained with `layout`'s parallel sizes (the order does not matter).
    ///
    /// With `L = layers / pp` layers per stage, `m` micro-batches per step, `e` bytes per element and
    /// `a = (seq_len / cp) · micro_batch · hidden · e`, one micro-batch's activations of one layer on one rank:
    /// - `tp = 4 · L · m · a`: Megatron's tensor parallelism all-reduces each layer's activations twice forward
    ///   (after attention and after the MLP) and twice backward; sequence parallelism's reduce-scatter +
    ///   all-gather pairs cost the same.
    /// - `cp = 2 · L · m · 2 · seq_len · micro_batch · hidden · e / tp`: each layer all-gathers the keys and values
    ///   of the whole sequence (heads split over tp, no grouped-query sharing) forward and reduce-scatters their
    ///   gradients backward.
    /// - `ep = 4 · L · m · a · top_k`: every layer is a mixture-of-experts layer whose tokens go to `top_k`
    ///   experts; dispatch and combine, forward and backward.
    /// - `dp = params · e / (tp · pp)`: this rank's share of the gradients, reduce-scattered, and of the
    ///   parameters, all-gathered, once per step in `dp_cp` groups; all parameters count as dense.
    /// - `expt_dp = 0`: expert parameters are not modelled apart; supply bytes to score them.
    /// - `pp = 2 · m · a`: each micro-batch's activations go forward to the next stage and their gradients back.
    ///
    /// Kinds whose parallel size is 1 get 0. Overlap of communication with compute is not modelled.
    ///
    /// ```
    /// use hypercomm_grid::layout::LayoutConfig;
    /// use hypercomm_plan::{ModelShape, Traffic};
    ///
    /// let layout = LayoutConfig::new(64).tp(8).pp(2).build()?;
    /// let traffic = Traffic::from_model(&ModelShape::default(), &layout)?;
    /// // 7e9 parameters in 2-byte elements, sharded over tp 8 and pp 2.
    /// assert_eq!(traffic.dp, 7e9 * 2.0 / 16.0);
    /// assert_eq!(traffic.cp, 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_model(
        shape: &ModelShape,
        layout: &ParallelLayout,
    ) -> Result<Traffic, TopologyError> {
        shape.check()?;
        let c = layout.config();
        let (tp, pp, cp, ep) = (c.tp as f64, c.pp as f64, c.cp as f64, c.ep as f64);
        let s = shape;
        let layers = s.layers / pp;
        let m = s.micro_batches;
        let e = s.bytes_per_element;
        let a = (s.seq_len / cp) * s.micro_batch * s.hidden * e;
        let when = |size: f64, bytes: f64| if size > 1.0 { bytes } else { 0.0 };
        Ok(Traffic {
            tp: when(tp, 4.0 * layers * m * a),
            cp: when(
                cp,
                2.0 * layers * m * 2.0 * s.seq_len * s.micro_batch * s.hidden * e / tp,
            ),
            ep: when(ep, 4.0 * layers * m * a * s.top_k),
            dp: when(layout.dp() as f64 * cp, s.params * e / (tp * pp)),
            expt_dp: 0.0,
            pp: when(pp, 2.0 * m * a),
        })
    }

    /// Applies `name=bytes` overrides separated by commas (`tp=4e9,dp=1.5G`). Names are the
    /// [`TrafficKind`] names; sizes are numbers with an optional `K`, `M`, `G` or `T` suffix (powers of 1000) and an
    /// optional `B`.
    ///
    /// ```
    /// use hypercomm_plan::Traffic;
    ///
    /// let traffic = Traffic::default().with_overrides("tp=4e9, pp=250MB")?;
    /// assert_eq!((traffic.tp, traffic.pp, traffic.dp), (4e9, 250e6, 0.0));
    /// assert!(Traffic::default().with_overrides("xp=1").is_err());
    /// # Ok::<(), hypercomm_plan::TopologyError>(())
    /// ```
    pub fn with_overrides(mut self, text: &str) -> Result<Traffic, TopologyError> {
        let bad = |why: String| TopologyError::BadTraffic {
            text: text.to_owned(),
            why,
        };
        for item in text.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| bad(format!("{:?} is not name=bytes", item.trim())))?;
            let name = name.trim();
            let kind = TrafficKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    bad(format!(
                        "unknown kind {name:?} (known: tp, cp, ep, dp, expt_dp, pp)"
                    ))
                })?;
            *self.bytes_mut(kind) = parse_bytes(value.trim()).map_err(bad)?;
        }
        Ok(self)
    }
}

/// Parses `250MB`, `1.5G`, `4e9`: a non-negative finite number, an optional decimal suffix and an optional `B`.
fn parse_bytes(text: &str) -> Result<f64, String> {
    let body = text.strip_suffix(['B', 'b']).unwrap_or(text);
    let (number, scale) = match body.chars().last() {
        Some('k' | 'K') => (&body[..body.len() - 1], 1e3),
        Some('M') => (&body[..body.len() - 1], 1e6),
        Some('G') => (&body[..body.len() - 1], 1e9),
        Some('T') => (&body[..body.len() - 1], 1e12),
        _ => (body, 1.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count"))?;
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 0.0) {
        return Err(format!("{text:?} must be a non-negative finite byte count"));
    }
    Ok(bytes)
}

/// A transformer's shape, for [`Traffic::from_model`]. The default is a Llama-2-7B-like model trained on 4096-token
/// sequences, one sequence per micro-batch, 8 micro-batches per step, in 2-byte elements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelShape {
    /// Parameter count.
    pub params: f64,
    /// Transformer layers.
    pub layers: f64,
    /// Hidden size.
    pub hidden: f64,
    /// Sequence length in tokens.
    pub seq_len: f64,
    /// Sequences per micro-batch.
    pub micro_batch: f64,
    /// Micro-batches per step (gradient accumulation).
    pub micro_batches: f64,
    /// Bytes per activation and gradient element.
    pub bytes_per_element: f64,
    /// Experts each token is routed to (used when ep > 1).
    pub top_k: f64,
}

impl Default for ModelShape {
    fn default() -> Self {
        ModelShape {
            params: 7e9,
            layers: 32.0,
            hidden: 4096.0,
            seq_len: 4096.0,
            micro_batch: 1.0,
            micro_batches: 8.0,
            bytes_per_element: 2.0,
            top_k: 2.0,
        }
    }
}

impl ModelShape {
    fn check(&self) -> Result<(), TopologyError> {
        for (field, value) in [
            ("params", self.params),
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("seq_len", self.seq_len),
            ("micro_batch", self.micro_batch),
            ("micro_batches", self.micro_batches),
            ("bytes_per_element", self.bytes_per_element),
            ("top_k", self.top_k),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(TopologyError::BadModel { field, value });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_grid::layout::LayoutConfig;

    #[test]
    fn factors_follow_the_ring_formulas() {
        assert_eq!(Collective::AllReduce.factor(1), 0.0);
        assert_eq!(Collective::AllReduce.factor(4), 1.5);
        assert_eq!(Collective::ReduceScatterAllGather.factor(2), 1.0);
        assert_eq!(Collective::AllGather.factor(8), 7.0 / 8.0);
        assert_eq!(Collective::AllToAll.factor(4), 0.75);
        assert_eq!(Collective::SendRecv.factor(2), 1.0);
        assert_eq!(Collective::SendRecv.factor(1), 0.0);
    }

    #[test]
    fn model_traffic_follows_the_documented_formulas() {
        let shape = ModelShape {
            params: 1e9,
            layers: 8.0,
            hidden: 1000.0,
            seq_len: 2000.0,
            micro_batch: 2.0,
            micro_batches: 4.0,
            bytes_per_element: 2.0,
            top_k: 1.0,
        };
        let layout = LayoutConfig::new(32).tp(2).pp(2).cp(2).build().unwrap();
        let t = Traffic::from_model(&shape, &layout).unwrap();
        // Layers per stage 4; a = (2000 / 2) * 2 * 1000 * 2 = 4e6 bytes.
        let a = 4e6;
        assert_eq!(t.tp, 4.0 * 4.0 * 4.0 * a);
        assert_eq!(
            t.cp,
            2.0 * 4.0 * 4.0 * 2.0 * 2000.0 * 2.0 * 1000.0 * 2.0 / 2.0
        );
        assert_eq!(t.ep, 0.0, "ep = 1 moves nothing");
        assert_eq!(t.dp, 1e9 * 2.0 / 4.0);
        assert_eq!(t.pp, 2.0 * 4.0 * a);
        let moe = LayoutConfig::new(32).tp(2).ep(4).build().unwrap();
        let t = Traffic::from_model(&shape, &moe).unwrap();
        assert_eq!(t.ep, 4.0 * 8.0 * 4.0 * (2000.0 * 2.0 * 1000.0 * 2.0));
        assert_eq!((t.pp, t.cp), (0.0, 0.0));
    }

    #[test]
    fn bad_model_and_overrides_name_the_value() {
        let layout = LayoutConfig::new(8).tp(8).build().unwrap();
        let shape = ModelShape {
            hidden: 0.0,
            ..ModelShape::default()
        };
        let err = Traffic::from_model(&shape, &layout).unwrap_err();
        assert_eq!(err.to_string(), "model hidden=0 must be a positive number");
        let err = Traffic::default().with_overrides("tp").unwrap_err();
        assert_eq!(err.to_string(), "traffic \"tp\": \"tp\" is not name=bytes");
        let err = Traffic::default().with_overrides("dp=-3").unwrap_err();
        assert!(err.to_string().contains("non-negative"), "{err}");
        let err = Traffic::default().with_overrides("dp=lots").unwrap_err();
        assert!(
            err.to_string().contains("\"lots\" is not a byte count"),
            "{err}"
        );
        let t = Traffic::default()
            .with_overrides("expt_dp=2kB,cp=1T")
            .unwrap();
        assert_eq!((t.expt_dp, t.cp), (2e3, 1e12));
    }
}
