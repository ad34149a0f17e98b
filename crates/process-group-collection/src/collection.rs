//! [`ProcessGroupCollection`]: one rank's communicators for every group it belongs to (built by
//! [`CollectionBuilder`](crate::CollectionBuilder)).
//!
//! Each group is one [`Communicator`]: host vectors always, and device buffers too when the collection is given a
//! GPU (its NCCL flavor over the same ranks).

use std::sync::{Arc, Mutex, OnceLock};

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommOptions, Communicator, FailureDomain};
use hypercomm_grid::Membership;
use hypercomm_grid::layout::GroupKind;
use hypercomm_store::{Key, PrefixStore, Store};

use crate::closing::needs_barrier;
use crate::plan::Topology;
use crate::{CollectionError, GroupId};

pub(crate) struct Entry {
    pub(crate) id: GroupId,
    pub(crate) membership: Result<Membership, &'static str>,
    /// The communicator's options, checked against the collection's GPU (or its absence) when the entry is made.
    pub(crate) options: CommOptions,
    pub(crate) group: OnceLock<Communicator>,
    /// Serialises lazy creation of `group`.
    pub(crate) init: Mutex<()>,
}

/// One rank's communicators for every group of a layout (or of custom groups) it belongs to, named with
/// Megatron-Core's `ProcessGroupCollection` field names. No global state: build as many as you like in one process.
///
/// ```no_run
/// use std::sync::Arc;
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_store::{MemoryStore, Store};
/// use process_group_collection::ProcessGroupCollection;
///
/// let layout = LayoutConfig::new(8).tp(2).build()?;
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// // On each of the 8 ranks (here: `rank`):
/// # let rank = 0;
/// let pgc = ProcessGroupCollection::for_layout("policy", layout)
///     .with_all_gather_groups(true)
///     .build(rank, store)?;
/// let tp = pgc.tp()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ProcessGroupCollection {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) entries: Vec<Entry>,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) topology: Topology,
    pub(crate) gpu: Option<Arc<Gpu>>,
}

impl std::fmt::Debug for ProcessGroupCollection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroupCollection")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("groups", &self.groups().collect::<Vec<_>>())
            .finish()
    }
}

macro_rules! accessors {
    ($($(#[$doc:meta])* $name:ident => $kind:ident),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Result<&Communicator, CollectionError> {
            self.get(&GroupId::kind(GroupKind::$kind.name()))
        }
    )*};
}

/// The kind name of the optional whole-world group ([`CollectionBuilder::with_world_group`](crate::CollectionBuilder::with_world_group)).
pub(crate) const WORLD: &str = "world";

impl ProcessGroupCollection {
    /// The collection's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Every group slot of the collection (including those this rank is not a member of).
    pub fn groups(&self) -> impl Iterator<Item = &GroupId> {
        self.entries.iter().map(|e| &e.id)
    }

    /// This rank's membership in `group`.
    pub fn membership(&self, group: &GroupId) -> Result<&Membership, CollectionError> {
        let entry = self.entry(group)?;
        entry
            .membership
            .as_ref()
            .map_err(|why| CollectionError::NotMember {
                collection: self.name.clone(),
                rank: self.rank,
                group: group.clone(),
                why,
            })
    }

    /// The communicator of `group`, created now if the collection is lazy and this is its first use. It takes
    /// host vectors and, when the collection has a GPU, device buffers.
    pub fn get(&self, group: &GroupId) -> Result<&Communicator, CollectionError> {
        self.membership(group)?;
        let entry = self.entry(group)?;
        if let Some(comm) = entry.group.get() {
            return Ok(comm);
        }
        self.create(entry)
    }

    /// The communicator of every rank of the layout; the collection must be built
    /// [`with_world_group(true)`](crate::CollectionBuilder::with_world_group).
    pub fn world(&self) -> Result<&Communicator, CollectionError> {
        let id = GroupId::kind(WORLD);
        if !self.entries.iter().any(|e| e.id == id) {
            return Err(CollectionError::Absent {
                collection: self.name.clone(),
                group: id,
                why: "world exists only when the collection is built with_world_group(true)".into(),
            });
        }
        self.get(&id)
    }

    /// Aborts every communicator of the collection that has been created, and every one split or shrunk from them
    /// (they share the collection's [`FailureDomain`], whose [`abort`](FailureDomain::abort) this is): host
    /// flavors tell their peers, NCCL flavors are stopped, all at once (the NCCL ones in one NCCL group where the
    /// loaded NCCL allows); pending and later operations on any of them fail. For giving up on a job after a
    /// failure, so that no communicator of this rank keeps its peers waiting. Returns within the domain's bound,
    /// 1.55 s (per domain: one, unless a group was given a domain of its own), whatever the peers and NCCL do.
    pub fn abort(&self) {
        // One domain, unless a group was given one of its own: each distinct domain once.
        let mut aborted: Vec<&Arc<FailureDomain>> = Vec::new();
        for comm in self.entries.iter().filter_map(|e| e.group.get()) {
            let domain = comm.failure_domain();
            if !aborted.iter().any(|d| Arc::ptr_eq(d, domain)) {
                domain.abort();
                aborted.push(domain);
            }
        }
    }

    /// The GPU the collection's NCCL communicators run on, if it has one.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref()
    }

    /// The primary communicator of a layout kind.
    pub fn get_kind(&self, kind: GroupKind) -> Result<&Communicator, CollectionError> {
        self.get(&GroupId::kind(kind.name()))
    }

    /// Level `level` of hierarchical context parallelism.
    pub fn hcp(&self, level: usize) -> Result<&Communicator, CollectionError> {
        self.get(&GroupId::hcp(level))
    }

    accessors! {
        /// Tensor parallel.
        tp => Tp,
        /// Pipeline parallel.
        pp => Pp,
        /// Model parallel (tensor and pipeline).
        mp => Mp,
        /// Embedding (first and last pipeline stage).
        embd => Embd,
        /// Position embedding (first pipeline stage).
        pos_embd => PosEmbd,
        /// Context parallel.
        cp => Cp,
        /// Tensor and context parallel.
        tp_cp => TpCp,
        /// Expert parallel.
        ep => Ep,
        /// Expert tensor parallel.
        expt_tp => ExptTp,
        /// Expert tensor and expert parallel.
        tp_ep => TpEp,
        /// Expert tensor, expert and pipeline parallel.
        tp_ep_pp => TpEpPp,
        /// Tensor, data and context parallel.
        tp_dp_cp => TpDpCp,
        /// Data parallel.
        dp => Dp,
        /// Data and context parallel.
        dp_cp => DpCp,
        /// The all-gather twin of `dp_cp`.
        dp_cp_ag => DpCpAg,
        /// Expert data parallel.
        expt_dp => ExptDp,
        /// The all-gather twin of `expt_dp`.
        expt_dp_ag => ExptDpAg,
        /// One distributed-optimizer instance's share of `dp_cp`.
        intra_dp_cp => IntraDpCp,
        /// One distributed-optimizer instance's share of `expt_dp`.
        intra_expt_dp => IntraExptDp,
        /// Across distributed-optimizer instances.
        inter_dist_opt => InterDistOpt,
        /// One distributed-optimizer instance.
        intra_dist_opt => IntraDistOpt,
    }

    fn entry(&self, group: &GroupId) -> Result<&Entry, CollectionError> {
        if let Some(entry) = self.entries.iter().find(|e| e.id == *group) {
            return Ok(entry);
        }
        let absent = |why: String| CollectionError::Absent {
            collection: self.name.clone(),
            group: group.clone(),
            why,
        };
        if let (Some(layout), Ok(kind)) = (&self.topology.layout, group.kind.parse::<GroupKind>()) {
            if let Err(source) = layout.groups(kind) {
                return Err(CollectionError::Layout {
                    collection: self.name.clone(),
                    source,
                });
            }
            if matches!(kind, GroupKind::DpCpAg | GroupKind::ExptDpAg)
                && !self.topology.all_gather_groups
            {
                return Err(absent(format!(
                    "{} exists only when the collection is built with_all_gather_groups(true)",
                    kind.name()
                )));
            }
        }
        if self.topology.kind_names().contains(&group.kind) {
            return Err(absent(if group.tag.is_empty() {
                format!("{} has no level {}", group.kind, group.level)
            } else {
                format!(
                    "no communicator tagged {:?} was requested for {}",
                    group.tag, group.kind
                )
            }));
        }
        Err(absent(format!(
            "unknown group kind (this collection has: {})",
            self.topology.kind_names().join(", ")
        )))
    }

    /// Creates `entry`'s communicator through the store (the host flavor, then the NCCL one when there is a GPU),
    /// unless another thread already has. Every member creates the same groups in the same order, so
    /// waiting for a group's members cannot deadlock.
    pub(crate) fn create<'a>(
        &'a self,
        entry: &'a Entry,
    ) -> Result<&'a Communicator, CollectionError> {
        let _guard = entry.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(comm) = entry.group.get() {
            return Ok(comm);
        }
        let comm_err = |source| CollectionError::Comm {
            collection: self.name.clone(),
            group: entry.id.clone(),
            source: Box::new(source),
        };
        let (Ok(m), Some(store)) = (&entry.membership, &self.store) else {
            return Err(CollectionError::Invalid {
                collection: self.name.clone(),
                what: format!(
                    "{} was not created when the collection was split from its parent",
                    entry.id
                ),
            });
        };
        let prefix = Key::new("collection")
            .push(self.name.as_str())
            .push(entry.id.kind.as_str())
            .push(entry.id.level)
            .push(m.group)
            .push(entry.id.tag.as_str());
        let scoped: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix, Arc::clone(store)));
        // The group's first member makes the NCCL unique id (with a GPU) and publishes it under the group's key;
        // only members read it.
        let comm = Communicator::connect(
            self.gpu.clone(),
            scoped,
            m.members.clone(),
            self.rank,
            entry.options.clone(),
        )
        .map_err(comm_err)?;
        Ok(entry.group.get_or_init(|| comm))
    }

    /// The closing barriers of an eager build, in slot order, each on this thread ([`Communicator::barrier_now`]:
    /// a communicator nobody has used yet starts no progress thread for it): one on every host communicator
    /// created, except those another one covers (see [`crate::closing`]).
    pub(crate) fn barrier_all(&self) -> Result<(), CollectionError> {
        let created: Vec<(&Entry, &Communicator)> = self
            .entries
            .iter()
            .filter_map(|e| Some((e, e.group.get()?)))
            .collect();
        let members: Vec<&[usize]> = created.iter().map(|(_, c)| c.ranks()).collect();
        for ((entry, comm), needed) in created.iter().zip(needs_barrier(&members)) {
            if !needed {
                continue;
            }
            comm.barrier_now().map_err(|source| CollectionError::Comm {
                collection: self.name.clone(),
                group: entry.id.clone(),
                source: Box::new(source),
            })?;
        }
        Ok(())
    }
}
