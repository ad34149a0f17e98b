//! [`Refit`]: one rank's side of a plan, run bucket by bucket over a communicator spanning the source and the
//! destination ranks.
//!
//! Each bucket is one [`Communicator::batch`]: the rank packs the runs it sends each peer into one staging
//! buffer, receives one buffer from each peer that sends to it, and once the batch completes copies the received
//! runs straight into its shards. Every send and receive of the bucket progresses at once, so the order in which
//! ranks issue them never deadlocks; the next bucket starts only when this one is done, which is what forwards
//! need (they read bytes that arrived in an earlier bucket). The plan bounds what a rank sends, and what it
//! receives, in one bucket: the staging buffers in flight hold at most twice the bucket size, and those kept for
//! the next bucket (and the next refit) at most twice again.
//!
//! The same code runs host and device shards: it is generic over [`StagedShards`], whose staging buffer type
//! picks the communicator's flavor (`Vec<u8>` on the host backend, `DeviceBuffer<u8>` on NCCL, where the tags
//! are 0 as NCCL needs). A `Refit` keeps staging buffers of one flavor, `B`.

use hypercomm_comm::{Communicator, P2p};

use crate::execute::error::ExecError;
use crate::execute::messages::{RankMessages, group_rank};
use crate::execute::shards::{StagedShards, Staging};
use crate::{Peer, PlanParam, RefitPlan};

/// What a run moved on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefitStats {
    /// Bytes this rank sent.
    pub sent: u64,
    /// Bytes this rank received.
    pub received: u64,
    /// Buckets this rank took part in.
    pub buckets: usize,
}

impl std::ops::AddAssign for RefitStats {
    fn add_assign(&mut self, other: RefitStats) {
        self.sent += other.sent;
        self.received += other.received;
        self.buckets += other.buckets;
    }
}

/// One rank's side of a refit plan, ready to run again after every training step: its messages are worked out
/// once, and its staging buffers (of type `B`: `Vec<u8>` for host shards, `DeviceBuffer<u8>` for device ones)
/// kept between buckets and runs.
///
/// The communicator must number the ranks as [`group_rank`] does: the `T` source ranks `0..T`, then the
/// destination ranks (a [`RefitGroup`](crate::RefitGroup) does).
#[derive(Debug)]
pub struct Refit<'p, B = Vec<u8>> {
    plan: &'p RefitPlan,
    me: Peer,
    rank: usize,
    messages: RankMessages,
    pool: Vec<B>,
}

impl<'p, B: Staging> Refit<'p, B> {
    /// Rank `me`'s side of `plan`: a source rank reads its shards, a destination rank writes its own (and reads
    /// them to forward). Fails when `me` is not a rank of the plan's layouts.
    pub fn new(plan: &'p RefitPlan, me: Peer) -> Result<Refit<'p, B>, ExecError> {
        Ok(Refit {
            plan,
            me,
            rank: group_rank(plan, me)?,
            messages: RankMessages::of(plan, me)?,
            pool: Vec::new(),
        })
    }

    /// This rank in the plan.
    pub fn peer(&self) -> Peer {
        self.me
    }

    /// This rank in the communicator the plan runs over.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The bytes of staging buffers kept for the next bucket.
    pub fn staging_bytes(&self) -> usize {
        self.pool.iter().map(Staging::capacity_bytes).sum()
    }

    /// Runs every bucket of the plan over `comm`, reading and writing this rank's `shards` in place. Fails with the
    /// bucket and the communicator's error when a peer dies, stalls or aborts (within the communicator's timeout;
    /// [`ExecError::lost_ranks`] names the lost peers), and before sending anything when a shard buffer does not
    /// have the plan's size. A failure of this rank's own (its buffers) aborts `comm`, so that the peers stop at
    /// once rather than at their timeout.
    pub fn run<S: StagedShards<Staging = B> + ?Sized>(
        &mut self,
        comm: &Communicator,
        shards: &mut S,
    ) -> Result<RefitStats, ExecError> {
        self.check(comm)?;
        let result = self.check_shards(&*shards).and_then(|()| {
            let mut stats = RefitStats::default();
            for bucket in 0..self.messages.buckets.len() {
                stats += self.bucket(comm, bucket, shards)?;
            }
            Ok(stats)
        });
        if let Err(e) = &result
            && !matches!(e, ExecError::Comm { .. })
        {
            // The peers would wait for this rank's messages until their timeout: stop them now.
            comm.abort();
        }
        result
    }

    /// Fails unless every shard this rank reads or writes has the plan's size.
    fn check_shards<S: StagedShards<Staging = B> + ?Sized>(
        &self,
        shards: &S,
    ) -> Result<(), ExecError> {
        let mut params: Vec<usize> = self
            .messages
            .buckets
            .iter()
            .flat_map(|b| b.sends.iter().chain(&b.recvs))
            .flat_map(|m| &m.transfers)
            .map(|&t| self.plan.transfers()[t].param)
            .collect();
        params.sort_unstable();
        params.dedup();
        for index in params {
            let param = &self.plan.params()[index];
            check_size(shards.shard_bytes(index, param)?, param, self.me)?;
        }
        Ok(())
    }

    /// Runs bucket `bucket` alone (nothing past the last bucket): for a caller that interleaves the refit with
    /// other work, running the buckets in order.
    pub fn run_bucket<S: StagedShards<Staging = B> + ?Sized>(
        &mut self,
        comm: &Communicator,
        bucket: usize,
        shards: &mut S,
    ) -> Result<RefitStats, ExecError> {
        self.check(comm)?;
        self.bucket(comm, bucket, shards)
    }

    /// Fails unless `comm` numbers the ranks as the plan needs, with this rank where it belongs.
    fn check(&self, comm: &Communicator) -> Result<(), ExecError> {
        let sources = self.plan.source().world();
        let needed = sources + self.plan.destination().world();
        if comm.size() != needed || comm.rank() != self.rank {
            return Err(ExecError::GroupMismatch {
                comm: comm.name().to_owned(),
                size: comm.size(),
                rank: comm.rank(),
                needed,
                sources,
                peer: self.me,
                want: self.rank,
            });
        }
        Ok(())
    }

    fn bucket<S: StagedShards<Staging = B> + ?Sized>(
        &mut self,
        comm: &Communicator,
        bucket: usize,
        shards: &mut S,
    ) -> Result<RefitStats, ExecError> {
        let Refit {
            plan,
            messages,
            pool,
            ..
        } = self;
        let Some(work) = messages.buckets.get(bucket) else {
            return Ok(RefitStats::default());
        };
        if work.sends.is_empty() && work.recvs.is_empty() {
            return Ok(RefitStats::default());
        }
        let mut stats = RefitStats {
            buckets: 1,
            ..RefitStats::default()
        };
        let mut parts = Vec::with_capacity(work.sends.len() + work.recvs.len());
        for message in &work.sends {
            let mut buf = take(pool, message.bytes, &*shards)?;
            let mut at = 0;
            for &t in &message.transfers {
                let t = &plan.transfers()[t];
                shards.pack(t.param, &plan.params()[t.param], &t.runs, &mut buf, at)?;
                at += t.runs.bytes() as usize;
            }
            stats.sent += buf.len() as u64;
            parts.push(P2p::send(buf, message.peer));
        }
        for message in &work.recvs {
            let buf = take(pool, message.bytes, &*shards)?;
            stats.received += buf.len() as u64;
            parts.push(P2p::recv(buf, message.peer));
        }
        let bufs = comm
            .batch(parts)
            .and_then(|work| work.wait())
            .map_err(|source| ExecError::Comm {
                bucket,
                source: Box::new(source),
            })?;
        // The buffers come back in the parts' order: the sends, then the receives.
        let mut bufs = bufs.into_iter();
        pool.extend(bufs.by_ref().take(work.sends.len()));
        for (message, buf) in work.recvs.iter().zip(bufs) {
            let mut at = 0;
            for &t in &message.transfers {
                let t = &plan.transfers()[t];
                shards.unpack(t.param, &plan.params()[t.param], &t.runs, &buf, at)?;
                at += t.runs.bytes() as usize;
            }
            pool.push(buf);
        }
        trim(pool, plan.options().bucket_bytes);
        Ok(stats)
    }
}

/// A staging buffer of `bytes`: the smallest kept one that holds them without growing, else a new one.
fn take<S: StagedShards + ?Sized>(
    pool: &mut Vec<S::Staging>,
    bytes: usize,
    shards: &S,
) -> Result<S::Staging, ExecError> {
    let fit = pool
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capacity_bytes() >= bytes)
        .min_by_key(|(_, b)| b.capacity_bytes())
        .map(|(i, _)| i);
    match fit {
        Some(i) => {
            let mut buf = pool.swap_remove(i);
            buf.fit(bytes)?;
            Ok(buf)
        }
        None => shards.staging(bytes),
    }
}

/// Drops the largest kept buffers until those kept hold at most two buckets.
fn trim<B: Staging>(pool: &mut Vec<B>, bucket_bytes: u64) {
    let limit = usize::try_from(bucket_bytes.saturating_mul(2)).unwrap_or(usize::MAX);
    pool.sort_by_key(|b| std::cmp::Reverse(b.capacity_bytes()));
    let mut kept: usize = pool.iter().map(Staging::capacity_bytes).sum();
    while kept > limit {
        kept -= pool.remove(0).capacity_bytes();
    }
}

/// The size a shard of `param` has on `me`'s side, and that side's name.
fn shard_size(param: &PlanParam, me: Peer) -> (u64, &'static str) {
    match me {
        Peer::Source(_) => (param.bytes / param.source_parts.max(1), "source"),
        Peer::Destination(_) => (param.shard_bytes(), "destination"),
    }
}

/// Fails unless a shard of `have` bytes has the plan's size for `param` on `me`'s side.
fn check_size(have: u64, param: &PlanParam, me: Peer) -> Result<(), ExecError> {
    let (want, side) = shard_size(param, me);
    if have != want {
        return Err(ExecError::ShardSize {
            peer: me,
            name: param.name.clone(),
            side,
            have,
            want,
        });
    }
    Ok(())
}
