//! Proptest strategies for refits, for users' own property tests. Enabled by the `proptest` cargo feature.
//!
//! ```
//! use hypercomm_refit::strategies::arb_refit;
//! use hypercomm_refit::{RefitPlan, Side};
//! use proptest::prelude::*;
//!
//! proptest!(ProptestConfig::with_cases(16), |(case in arb_refit(16, 4))| {
//!     let plan = RefitPlan::build(
//!         Side::new(&case.source, &case.sharding),
//!         Side::new(&case.destination, &case.sharding),
//!         case.options,
//!     ).unwrap();
//!     prop_assert_eq!(plan.moved_bytes(), plan.needed_bytes());
//! });
//! ```

use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::{DType, MIN_BUCKET_BYTES, ParamSharding, Place, PlanOptions, Sharding, Split};

/// Two layouts, a sharding that fits both, and plan options: the inputs of one refit plan.
#[derive(Debug, Clone)]
pub struct RefitCase {
    /// The source layout.
    pub source: ParallelLayout,
    /// The destination layout.
    pub destination: ParallelLayout,
    /// A sharding that fits both layouts.
    pub sharding: Sharding,
    /// Options: a bucket of 1 to 8 times [`MIN_BUCKET_BYTES`], forwarding on or off.
    pub options: PlanOptions,
}

/// Refits between any two Megatron-Core layouts of at most `max_world` ranks (every order, offset, cp, ep and
/// etp the grid crate's `arb_layout` makes) of 1 to `max_params` small parameters (at most a few kB each) that fit
/// both: scalars and tensors of up to 3 dimensions, replicated or split along any dimension in 1 or 2 blocks,
/// every element type's size, placed first, last, on both, by layer or by stage, dense or of an expert.
pub fn arb_refit(max_world: usize, max_params: usize) -> impl Strategy<Value = RefitCase> {
    let layouts = (
        hypercomm_grid::strategies::arb_layout(max_world),
        hypercomm_grid::strategies::arb_layout(max_world),
    );
    with_sharding(layouts, max_params)
}

/// Like [`arb_refit`] at scale: layouts of up to `max_world` ranks with large dp (tp 1 to 8, pp 1 to 4, cp 1 or
/// 2, ep 1, 2 or 4, dp whatever fits), the shapes of the plans a real job makes over thousands of ranks.
pub fn arb_refit_at_scale(max_world: usize, max_params: usize) -> impl Strategy<Value = RefitCase> {
    with_sharding(
        (arb_wide_layout(max_world), arb_wide_layout(max_world)),
        max_params,
    )
}

/// A layout of at most `max_world` ranks whose dp takes up whatever tp, pp and cp leave.
fn arb_wide_layout(max_world: usize) -> impl Strategy<Value = ParallelLayout> {
    (
        proptest::sample::select(vec![1usize, 2, 4, 8]),
        proptest::sample::select(vec![1usize, 2, 4]),
        proptest::sample::select(vec![1usize, 2]),
        proptest::sample::select(vec![1usize, 2, 4]),
        any::<bool>(),
        any::<Index>(),
    )
        .prop_filter_map(
            "tp, pp and cp leave room for dp",
            move |(tp, pp, cp, ep, etp_one, dp)| {
                // Megatron has no ep with cp; a dp that ep divides fits ep whatever etp is.
                let (ep, cp) = if ep > 1 { (ep, 1) } else { (1, cp) };
                let room = max_world / (tp * pp * cp);
                if room < ep {
                    return None;
                }
                let dp = ep * (1 + dp.index(room / ep));
                let etp = if etp_one { 1 } else { tp };
                LayoutConfig::new(tp * pp * cp * dp)
                    .tp(tp)
                    .pp(pp)
                    .cp(cp)
                    .ep(ep)
                    .etp(etp)
                    .build()
                    .ok()
            },
        )
}

/// One parameter's random choices, resolved against the pair of layouts by [`RawParam::resolve`].
#[derive(Debug, Clone)]
struct RawParam {
    dims: usize,
    split: Option<(Index, u64)>,
    split_factor: u64,
    other: [u64; 3],
    dtype: Index,
    place: (u8, Index),
    expert: Option<Index>,
}

fn arb_raw_param() -> impl Strategy<Value = RawParam> {
    (
        0usize..=3,
        proptest::option::weighted(0.7, (any::<Index>(), 1u64..=2)),
        1u64..=2,
        [1u64..=3, 1u64..=3, 1u64..=3],
        any::<Index>(),
        (0u8..5, any::<Index>()),
        proptest::option::weighted(0.3, any::<Index>()),
    )
        .prop_map(
            |(dims, split, split_factor, other, dtype, place, expert)| RawParam {
                dims,
                split,
                split_factor,
                other,
                dtype,
                place,
                expert,
            },
        )
}

/// What a sharding must divide to fit both layouts.
struct Fit {
    tp: u64,
    etp: u64,
    layers: usize,
    experts: usize,
    min_pp: usize,
}

impl RawParam {
    fn resolve(&self, name: String, fit: &Fit) -> ParamSharding {
        let expert = self.expert.map(|e| e.index(fit.experts));
        let tp = if expert.is_some() { fit.etp } else { fit.tp };
        // A scalar cannot be split.
        let split = self.split.filter(|_| self.dims > 0);
        let mut shape: Vec<u64> = self.other[..self.dims].to_vec();
        let split = match split {
            None => Split::Replicated,
            Some((dim, blocks)) => {
                let dim = dim.index(self.dims);
                shape[dim] = tp * blocks * self.split_factor;
                Split::Tp { dim, blocks }
            }
        };
        let (kind, at) = self.place;
        let place = match kind {
            0 => Place::First,
            1 => Place::Last,
            2 => Place::FirstAndLast,
            3 => Place::Layer(at.index(fit.layers)),
            _ => Place::Stage(at.index(fit.min_pp)),
        };
        let dtype = DType::ALL[self.dtype.index(DType::ALL.len())];
        let param = ParamSharding::new(name, shape, dtype, split, place);
        match expert {
            Some(e) => param.of_expert(e),
            None => param,
        }
    }
}

fn with_sharding(
    layouts: impl Strategy<Value = (ParallelLayout, ParallelLayout)>,
    max_params: usize,
) -> impl Strategy<Value = RefitCase> {
    (
        layouts,
        proptest::collection::vec(arb_raw_param(), 1..=max_params.max(1)),
        1u64..=2,
        1u64..=8,
        any::<bool>(),
    )
        .prop_map(
            |((source, destination), raw, layer_factor, bucket, forward)| {
                let (a, b) = (source.config(), destination.config());
                let fit = Fit {
                    tp: lcm(a.tp, b.tp) as u64,
                    etp: lcm(source.etp(), destination.etp()) as u64,
                    layers: lcm(a.pp, b.pp) * layer_factor as usize,
                    experts: lcm(a.ep, b.ep),
                    min_pp: a.pp.min(b.pp),
                };
                let mut sharding = Sharding::new(fit.layers, fit.experts);
                for (i, raw) in raw.iter().enumerate() {
                    sharding.push(raw.resolve(format!("p{i}"), &fit));
                }
                RefitCase {
                    source,
                    destination,
                    sharding,
                    options: PlanOptions::default()
                        .bucket_bytes(bucket * MIN_BUCKET_BYTES)
                        .forward(forward),
                }
            },
        )
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}
