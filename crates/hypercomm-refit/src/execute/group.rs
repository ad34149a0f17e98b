//! [`RefitGroup`]: the communicator a refit runs over, joined by a trainer's ranks and its engines' ranks through
//! one store, even when they are two jobs launched apart, under a namespace and an epoch.
//!
//! The group numbers its ranks as a plan's executor needs: the `T` source (trainer) ranks `0..T`, then the
//! destination (engine) ranks; these *refit ranks* are the member ids its errors name. How a rank joins:
//!
//! 1. It reads its own announcement, `refit/announce/<refit rank>` (`<epoch> <namespace>`). Joining an epoch no
//!    later than the one announced there is an error ([`ExecError::StaleEpoch`]): each epoch is joined once, so a
//!    restarted engine joins a new one and can never read a bootstrap record of an epoch its earlier incarnation
//!    took part in.
//! 2. It announces its namespace and epoch there, and checks them against the others': refit rank 0 against every
//!    rank's, every other rank against rank 0's. A rank of the same namespace already at a later epoch is an error
//!    at once; one of another namespace or an earlier epoch is waited for (it may not have rejoined yet) and is an
//!    error naming both at the timeout ([`ExecError::Mismatch`]). The announcements live outside any namespace
//!    so that a rank of another namespace is seen, not waited for in silence: one store serves one refit (give
//!    two refits two [`PrefixStore`](hypercomm_store::PrefixStore)s).
//! 3. It builds a collection named `<namespace>/refit/<epoch>` holding one group of every refit rank, whose
//!    failure domain makes a peer lost mid-refit an error on every rank naming it by refit rank within the
//!    timeout. Its bootstrap keys carry the namespace and the epoch; once the build's closing barrier shows that
//!    every rank has read them, each rank deletes those it wrote, and its failure record of its previous epoch
//!    (every rank has left that epoch by then, so none still looks for the record).
//!
//! So a group lives in the store as one announcement per refit rank, and refitting every step over it adds no
//! key. A failed epoch leaves each surviving rank's failure record until that rank joins the next epoch, and a
//! build that failed midway leaves its bootstrap records (under that epoch's keys, which no later epoch reads).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::Communicator;
use hypercomm_store::{Key, Store, StoreError};
use process_group_collection::{GroupId, ProcessGroupCollection};

use crate::execute::error::ExecError;
use crate::execute::ledger::Ledger;
use crate::execute::messages::group_rank;
use crate::execute::run::{Refit, RefitStats};
use crate::execute::shards::{StagedShards, Staging};
use crate::{Peer, RefitPlan};

/// The kind of the group's one communicator in its collection.
const KIND: &str = "refit";

/// The longest pause between two looks at the other ranks' announcements.
const MAX_POLL: Duration = Duration::from_millis(50);

/// How a rank joins a [`RefitGroup`]: the namespace both jobs agree on, the epoch, and the communicator's
/// timeout and transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefitGroupOptions {
    /// The refit's namespace, the same on every rank of both jobs (an RL run's name, say).
    pub namespace: String,
    /// The epoch: the same on every rank, and later than any epoch a rank joined before (start at 1 and add one
    /// each time the group is set up again after a failure).
    pub epoch: u64,
    /// How long the join and every refit wait for a peer before failing (default 300 s).
    pub timeout: Duration,
    /// Host backend: TCP even between ranks on one machine.
    pub force_tcp: bool,
}

impl RefitGroupOptions {
    /// The options for `epoch` of the refit `namespace`, with a 300 s timeout.
    pub fn new(namespace: impl Into<String>, epoch: u64) -> RefitGroupOptions {
        RefitGroupOptions {
            namespace: namespace.into(),
            epoch,
            timeout: Duration::from_secs(300),
            force_tcp: false,
        }
    }

    /// Sets the timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets whether the host backend uses TCP between ranks on one machine.
    #[must_use]
    pub fn force_tcp(mut self, on: bool) -> Self {
        self.force_tcp = on;
        self
    }

    fn collection_name(namespace: &str, epoch: u64) -> String {
        format!("{namespace}/{KIND}/{epoch}")
    }

    fn store_err(&self) -> impl FnOnce(StoreError) -> ExecError + '_ {
        move |source| ExecError::Store {
            namespace: self.namespace.clone(),
            epoch: self.epoch,
            source: Box::new(source),
        }
    }
}

/// Where refit rank `rank` announces the namespace and epoch it joined.
fn announce_key(rank: usize) -> Key {
    Key::new(KIND).push("announce").push(rank)
}

/// The failure record refit rank `rank` leaves when epoch `epoch` of `namespace` fails (the collection's
/// failure domain keeps its records under `collection/<name>/failures/<rank>`).
fn failure_key(namespace: &str, epoch: u64, rank: usize) -> Key {
    Key::new("collection")
        .push(RefitGroupOptions::collection_name(namespace, epoch))
        .push("failures")
        .push(rank)
}

/// What refit rank `rank` announced: `(epoch, namespace)`.
fn announced(store: &dyn Store, rank: usize) -> Result<Option<(u64, String)>, StoreError> {
    let Some(value) = store.try_get(&announce_key(rank))? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&value);
    // A record this module did not write reads as epoch 0 of its whole text: a mismatch, never a match.
    Ok(Some(match text.split_once(' ') {
        Some((epoch, namespace)) => match epoch.parse() {
            Ok(epoch) => (epoch, namespace.to_owned()),
            Err(_) => (0, text.into_owned()),
        },
        None => (0, text.into_owned()),
    }))
}

/// The communicator of one epoch of a refit, over the source ranks then the destination ranks; see the module
/// docs for how ranks join and what they leave in the store.
#[derive(Debug)]
pub struct RefitGroup {
    collection: ProcessGroupCollection,
    options: RefitGroupOptions,
    rank: usize,
    sources: usize,
    destinations: usize,
}

impl RefitGroup {
    /// Joins the group of `sources` source ranks and `destinations` destination ranks as refit rank `rank`
    /// (`0..sources` for a source, `sources + d` for destination `d`), through `store`. Every rank of both sides
    /// calls it with the same sizes and options; it returns once all have joined, or fails within the timeout.
    pub fn join(
        store: Arc<dyn Store>,
        options: RefitGroupOptions,
        sources: usize,
        destinations: usize,
        rank: usize,
    ) -> Result<RefitGroup, ExecError> {
        let size = sources + destinations;
        if sources == 0 || destinations == 0 || rank >= size {
            return Err(ExecError::BadGroup {
                namespace: options.namespace.clone(),
                why: format!(
                    "refit rank {rank} of {sources} source and {destinations} destination ranks: each side needs \
                     a rank and the rank must be below {size}"
                ),
            });
        }
        let namespace = &options.namespace;
        let previous = announced(&*store, rank).map_err(options.store_err())?;
        if let Some((epoch, theirs)) = &previous
            && theirs == namespace
            && *epoch >= options.epoch
        {
            return Err(ExecError::StaleEpoch {
                rank,
                namespace: namespace.clone(),
                epoch: options.epoch,
                previous: *epoch,
            });
        }
        store
            .set(
                &announce_key(rank),
                format!("{} {namespace}", options.epoch).as_bytes(),
            )
            .map_err(options.store_err())?;
        let peers: Vec<usize> = if rank == 0 {
            (1..size).collect()
        } else {
            vec![0]
        };
        await_announcements(&*store, &options, rank, peers)?;

        let ledger = Arc::new(Ledger::new(Arc::clone(&store)));
        let collection = ProcessGroupCollection::custom(RefitGroupOptions::collection_name(
            namespace,
            options.epoch,
        ))
        .with_explicit_groups(KIND, vec![(0..size).collect()])
        .with_timeout(options.timeout)
        .with_force_tcp(options.force_tcp)
        .build(rank, Arc::clone(&ledger) as Arc<dyn Store>)?;
        // The build ended with a barrier over every rank: all have read the bootstrap records, and all have left
        // the previous epoch (whose failure, if any, they learnt of before joining this one), so nobody reads this
        // rank's failure record of it any more.
        ledger.delete_written().map_err(options.store_err())?;
        if let Some((epoch, theirs)) = previous {
            store
                .delete(&failure_key(&theirs, epoch, rank))
                .map_err(options.store_err())?;
        }
        Ok(RefitGroup {
            collection,
            options,
            rank,
            sources,
            destinations,
        })
    }

    /// Joins the group `plan` runs over as `me`: [`join`](Self::join) with the plan's sizes and `me`'s refit rank.
    pub fn for_plan(
        store: Arc<dyn Store>,
        options: RefitGroupOptions,
        plan: &RefitPlan,
        me: Peer,
    ) -> Result<RefitGroup, ExecError> {
        let rank = group_rank(plan, me)?;
        RefitGroup::join(
            store,
            options,
            plan.source().world(),
            plan.destination().world(),
            rank,
        )
    }

    /// The epoch refit rank `rank` last joined under `namespace` in `store`, if any: where a restarted rank finds
    /// the epoch it must pass (a later one).
    pub fn last_epoch(
        store: &dyn Store,
        namespace: &str,
        rank: usize,
    ) -> Result<Option<u64>, StoreError> {
        Ok(announced(store, rank)?
            .filter(|(_, theirs)| theirs == namespace)
            .map(|(epoch, _)| epoch))
    }

    /// The group's communicator: sources `0..T`, then destinations.
    pub fn comm(&self) -> Result<&Communicator, ExecError> {
        Ok(self.collection.get(&GroupId::kind(KIND))?)
    }

    /// Runs `refit` (this rank's side of a plan over this group) on `shards`; see [`Refit::run`].
    pub fn run<B: Staging, S: StagedShards<Staging = B> + ?Sized>(
        &self,
        refit: &mut Refit<'_, B>,
        shards: &mut S,
    ) -> Result<RefitStats, ExecError> {
        refit.run(self.comm()?, shards)
    }

    /// This rank's refit rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The source ranks.
    pub fn sources(&self) -> usize {
        self.sources
    }

    /// The destination ranks.
    pub fn destinations(&self) -> usize {
        self.destinations
    }

    /// The options it was joined with.
    pub fn options(&self) -> &RefitGroupOptions {
        &self.options
    }

    /// Aborts the group's communicator on this rank, so that its peers stop at once.
    pub fn abort(&self) {
        self.collection.abort();
    }
}

/// Waits until each of `peers` has announced `options`' namespace and epoch; see the module docs for what is
/// an error at once and what at the timeout.
fn await_announcements(
    store: &dyn Store,
    options: &RefitGroupOptions,
    rank: usize,
    mut pending: Vec<usize>,
) -> Result<(), ExecError> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let mismatch = |peer: usize, (peer_epoch, peer_namespace): (u64, String)| ExecError::Mismatch {
        rank,
        namespace: options.namespace.clone(),
        epoch: options.epoch,
        peer,
        peer_namespace,
        peer_epoch,
    };
    let mut pause = Duration::from_millis(1);
    // Bounded: every round sleeps, and the loop ends at the deadline.
    loop {
        let mut waiting = Vec::new();
        for peer in pending {
            match announced(store, peer).map_err(options.store_err())? {
                Some((epoch, ns)) if epoch == options.epoch && ns == options.namespace => {}
                Some((epoch, ns)) if epoch > options.epoch && ns == options.namespace => {
                    return Err(mismatch(peer, (epoch, ns)));
                }
                seen => waiting.push((peer, seen)),
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            // A rank that announced something else says more than one that announced nothing.
            let pick = waiting
                .iter()
                .position(|(_, seen)| seen.is_some())
                .unwrap_or(0);
            let (peer, seen) = waiting.swap_remove(pick);
            return Err(match seen {
                Some(seen) => mismatch(peer, seen),
                None => ExecError::Absent {
                    rank,
                    peer,
                    namespace: options.namespace.clone(),
                    epoch: options.epoch,
                    after: started.elapsed(),
                },
            });
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_POLL);
        pending = waiting.into_iter().map(|(peer, _)| peer).collect();
    }
}
