//! [`RefitPlan`]: for every destination rank, the bytes of every parameter shard it needs and who sends each, in
//! buckets; computed by every rank alone, with no communication, from the two layouts and shardings.
//!
//! How a plan is made:
//!
//! 1. Each destination shard (held by a *class* of replicas) overlaps some source shards (each held by a *group*
//!    of replicas). The bytes they share are strided [`Runs`] between the two local layouts, cut into chunks of
//!    at most one bucket.
//! 2. With forwarding (the default), each chunk is sent by the sources to one member of its class, the members
//!    taking turns by bytes, and travels on between the members; without, the sources send it to every member.
//! 3. Each group of source replicas splits the bytes it serves evenly (see the crate docs for the bound).
//! 4. Transfers are packed into buckets; forwards come in later buckets than the bytes they forward.
//!
//! The same inputs give the same plan on every machine: no randomness, no hashing order, no floating point.

use std::collections::BTreeMap;

use hypercomm_grid::layout::ParallelLayout;
use serde::{Deserialize, Serialize};

use crate::balance::assign_sources;
use crate::chunks::{Chunk, RankSets, deliveries, push_chunks};
use crate::placement::Placer;
use crate::schedule::schedule;
use crate::shard::Shard;
use crate::{DType, Peer, RefitError, Sharding, Transfer};

/// The default bucket: 64 MiB per rank per bucket.
pub const DEFAULT_BUCKET_BYTES: u64 = 64 << 20;

/// The smallest bucket a plan accepts.
pub const MIN_BUCKET_BYTES: u64 = 1024;

/// The most ranks a layout of a plan may have: 2^20. A plan lists every rank's transfers.
pub const MAX_RANKS: usize = 1 << 20;

/// How a plan is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanOptions {
    /// The most bytes a rank sends, and the most it receives, in one bucket; a transfer is never larger.
    pub bucket_bytes: u64,
    /// Whether destination replicas forward to each other, so that the sources send each destination shard once
    /// rather than once per replica.
    pub forward: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            forward: true,
        }
    }
}

impl PlanOptions {
    /// Sets the bucket size.
    #[must_use]
    pub fn bucket_bytes(mut self, bucket_bytes: u64) -> Self {
        self.bucket_bytes = bucket_bytes;
        self
    }

    /// Sets whether destination replicas forward to each other.
    #[must_use]
    pub fn forward(mut self, forward: bool) -> Self {
        self.forward = forward;
        self
    }

    fn check(&self) -> Result<(), RefitError> {
        if self.bucket_bytes < MIN_BUCKET_BYTES {
            return Err(RefitError::BucketTooSmall {
                bytes: self.bucket_bytes,
                min: MIN_BUCKET_BYTES,
            });
        }
        Ok(())
    }
}

/// One side of a refit: a layout and how the model is laid out on it.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// The layout.
    pub layout: &'a ParallelLayout,
    /// The model's sharding.
    pub sharding: &'a Sharding,
}

impl<'a> Side<'a> {
    /// `sharding` laid out on `layout`.
    pub fn new(layout: &'a ParallelLayout, sharding: &'a Sharding) -> Side<'a> {
        Side { layout, sharding }
    }
}

/// A parameter of a plan, in the destination sharding's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanParam {
    /// Its name.
    pub name: String,
    /// Its full shape.
    pub shape: Vec<u64>,
    /// Its element type.
    pub dtype: DType,
    /// The full tensor's bytes.
    pub bytes: u64,
    /// Its shards on the source layout.
    pub source_parts: u64,
    /// Its shards on the destination layout.
    pub destination_parts: u64,
    /// The destination ranks that hold a shard of it.
    pub destination_ranks: usize,
}

impl PlanParam {
    /// The bytes of one destination shard.
    pub fn shard_bytes(&self) -> u64 {
        self.bytes / self.destination_parts.max(1)
    }

    /// The bytes the destination ranks hold of it, together.
    pub fn needed(&self) -> u64 {
        self.shard_bytes()
            .saturating_mul(self.destination_ranks as u64)
    }
}

/// Source replicas of a shard and the bytes they serve together; each of them sends an even share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceGroup {
    /// The source ranks, ascending.
    pub holders: Vec<usize>,
    /// The bytes the group sends.
    pub bytes: u64,
}

/// A weight refit plan; see the module docs.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_refit::{GptConfig, Peer, PlanOptions, RefitPlan, Side};
///
/// let sharding = GptConfig::new(4, 256, 1024).sharding()?;
/// let trainer = LayoutConfig::new(8).tp(2).pp(2).build()?;
/// let engines = LayoutConfig::new(4).tp(2).build()?; // two replicas of tp 2
/// let plan = RefitPlan::build(Side::new(&trainer, &sharding), Side::new(&engines, &sharding), PlanOptions::default())?;
/// assert_eq!(plan.moved_bytes(), plan.needed_bytes());
/// // The trainer sends each engine shard once, the model's bytes; the replicas forward to each other.
/// let from_sources: u64 = plan.transfers().iter().filter(|t| matches!(t.from, Peer::Source(_))).map(|t| t.bytes()).sum();
/// assert_eq!(from_sources, sharding.bytes()?);
/// assert!(plan.needed_bytes() > 2 * from_sources); // norms and row-parallel biases: whole on every engine rank
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefitPlan {
    source: ParallelLayout,
    destination: ParallelLayout,
    options: PlanOptions,
    params: Vec<PlanParam>,
    groups: Vec<SourceGroup>,
    buckets: usize,
    transfers: Vec<Transfer>,
}

impl RefitPlan {
    /// Plans the refit of every parameter of `to`'s sharding from `from`. Parameters are matched by name and must
    /// have the same shape and element type on both sides; source parameters the destination lacks are ignored.
    /// Fails when a sharding does not fit its layout, a parameter is missing or differs, the bucket is below
    /// [`MIN_BUCKET_BYTES`], a layout has more than [`MAX_RANKS`] ranks, or the bytes to move overflow 64 bits.
    pub fn build(
        from: Side<'_>,
        to: Side<'_>,
        options: PlanOptions,
    ) -> Result<RefitPlan, RefitError> {
        options.check()?;
        for (side, layout) in [("source", from.layout), ("destination", to.layout)] {
            if layout.world() > MAX_RANKS {
                return Err(RefitError::TooManyRanks {
                    side,
                    world: layout.world(),
                    max: MAX_RANKS,
                });
            }
        }
        from.sharding.check()?;
        to.sharding.check()?;
        // Every byte count of the plan (needed, moved, per group, the baseline) is at most this.
        let model = to.sharding.bytes()?;
        model
            .checked_mul(to.layout.world() as u64)
            .ok_or(RefitError::TooManyBytes {
                bytes: model,
                ranks: to.layout.world(),
            })?;
        let by_name: BTreeMap<&str, _> = from
            .sharding
            .params
            .iter()
            .map(|p| (p.name.as_str(), p))
            .collect();
        let mut src_placer = Placer::new(from.layout, from.sharding);
        let mut dst_placer = Placer::new(to.layout, to.sharding);
        let (mut classes, mut groups) = (RankSets::default(), RankSets::default());
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut params = Vec::with_capacity(to.sharding.params.len());
        for (index, dst) in to.sharding.params.iter().enumerate() {
            let src =
                by_name
                    .get(dst.name.as_str())
                    .ok_or_else(|| RefitError::MissingInSource {
                        name: dst.name.clone(),
                    })?;
            let mismatch = |what, on_source: String, on_destination: String| RefitError::Mismatch {
                name: dst.name.clone(),
                what,
                on_source,
                on_destination,
            };
            if src.shape != dst.shape {
                return Err(mismatch(
                    "shape",
                    format!("{:?}", src.shape),
                    format!("{:?}", dst.shape),
                ));
            }
            if src.dtype != dst.dtype {
                return Err(mismatch(
                    "element type",
                    src.dtype.to_string(),
                    dst.dtype.to_string(),
                ));
            }
            let sp = src_placer.place(src)?;
            let dp = dst_placer.place(dst)?;
            let elem = dst.dtype.size();
            for (t, members) in dp.holders.iter().enumerate() {
                if members.is_empty() {
                    continue;
                }
                let class = classes.intern(&dp.holders, t);
                let dst_shard =
                    Shard::new(&dst.shape, elem, dst.split.dim_blocks(), dp.parts, t as u64);
                for (u, holders) in sp.holders.iter().enumerate() {
                    if holders.is_empty() {
                        continue;
                    }
                    let src_shard =
                        Shard::new(&src.shape, elem, src.split.dim_blocks(), sp.parts, u as u64);
                    let runs = src_shard.overlap(&dst_shard);
                    if runs.is_empty() {
                        continue;
                    }
                    let group = groups.intern(&sp.holders, u);
                    push_chunks(
                        &mut chunks,
                        index,
                        class,
                        group,
                        &runs,
                        elem,
                        options.bucket_bytes,
                    );
                }
            }
            params.push(PlanParam {
                name: dst.name.clone(),
                shape: dst.shape.clone(),
                dtype: dst.dtype,
                bytes: dst.bytes()?,
                source_parts: sp.parts,
                destination_parts: dp.parts,
                destination_ranks: dp.holders.iter().map(Vec::len).sum(),
            });
        }
        let deliveries = deliveries(&chunks, &classes, options.forward);
        let (sends, totals) = assign_sources(&chunks, &deliveries, &groups);
        let (transfers, buckets) = schedule(
            &chunks,
            &classes,
            sends,
            options.forward,
            options.bucket_bytes,
        );
        Ok(RefitPlan {
            source: from.layout.clone(),
            destination: to.layout.clone(),
            options,
            params,
            groups: groups
                .all()
                .zip(totals)
                .map(|(holders, bytes)| SourceGroup {
                    holders: holders.to_vec(),
                    bytes,
                })
                .collect(),
            buckets,
            transfers,
        })
    }

    /// The source layout.
    pub fn source(&self) -> &ParallelLayout {
        &self.source
    }

    /// The destination layout.
    pub fn destination(&self) -> &ParallelLayout {
        &self.destination
    }

    /// The options the plan was made with.
    pub fn options(&self) -> PlanOptions {
        self.options
    }

    /// The parameters, in the destination sharding's order; [`Transfer::param`] indexes them.
    pub fn params(&self) -> &[PlanParam] {
        &self.params
    }

    /// The groups of source replicas and the bytes each serves.
    pub fn groups(&self) -> &[SourceGroup] {
        &self.groups
    }

    /// Every transfer, in bucket order.
    pub fn transfers(&self) -> &[Transfer] {
        &self.transfers
    }

    /// The number of buckets.
    pub fn bucket_count(&self) -> usize {
        self.buckets
    }

    /// The transfers of bucket `bucket` (empty past the last). An executor runs a bucket as one batch of sends and
    /// receives and waits for it before the next: a forward only reads bytes that arrived in an earlier bucket, and
    /// no rank sends, nor receives, more than the bucket size in one.
    pub fn bucket(&self, bucket: usize) -> &[Transfer] {
        let start = self.transfers.partition_point(|t| t.bucket < bucket);
        let end = self.transfers.partition_point(|t| t.bucket <= bucket);
        &self.transfers[start..end]
    }

    /// Every bucket's transfers, in order.
    pub fn buckets(&self) -> impl Iterator<Item = &[Transfer]> {
        (0..self.buckets).map(|b| self.bucket(b))
    }

    /// The transfers `peer` sends or, for a destination rank, receives, in bucket order: what one rank executes.
    pub fn transfers_of(&self, peer: Peer) -> impl Iterator<Item = &Transfer> {
        self.transfers
            .iter()
            .filter(move |t| t.from == peer || Peer::Destination(t.to) == peer)
    }

    /// The bytes the destination ranks hold, together: what they need.
    pub fn needed_bytes(&self) -> u64 {
        self.params
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.needed()))
    }

    /// The bytes every transfer moves, together.
    pub fn moved_bytes(&self) -> u64 {
        self.transfers
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.bytes()))
    }

    /// Source rank `rank`'s balanced share: the bytes of each group it belongs to divided among the group's holders,
    /// summed. It sends this share to within two elements per group.
    pub fn balanced_share(&self, rank: usize) -> f64 {
        self.groups
            .iter()
            .filter(|g| g.holders.binary_search(&rank).is_ok())
            .map(|g| g.bytes as f64 / g.holders.len() as f64)
            .sum()
    }
}
