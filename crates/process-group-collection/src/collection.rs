//! [`ProcessGroupCollection`]: one rank's communicators for every group it belongs to, and its builder.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hypercomm_comm::{BackendKind, CommOptions, Communicator};
use hypercomm_grid::layout::{GroupKind, ParallelLayout};
use hypercomm_grid::{DimSet, Grid, Membership};
use hypercomm_store::{Key, PrefixStore, Store};

use crate::plan::{CustomGroups, Slot, Topology};
use crate::{CollectionError, GroupId, GroupOptions};

/// When communicators are created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Creation {
    /// All at build time, each finished by a barrier, so a missing rank shows at start-up rather than at first use.
    #[default]
    Eager,
    /// Each on first use, by the members only. Needs the store-keyed bootstrap: a split involves the whole parent.
    Lazy,
}

/// Builds a [`ProcessGroupCollection`]; start from [`ProcessGroupCollection::for_layout`] or
/// [`ProcessGroupCollection::custom`].
#[derive(Debug, Clone)]
pub struct CollectionBuilder {
    name: String,
    topology: Topology,
    options: GroupOptions,
    creation: Creation,
    backend: BackendKind,
    timeout: Duration,
    force_tcp: bool,
}

impl CollectionBuilder {
    /// Also create `dp_cp_ag` (and `expt_dp_ag` when ep > 1): separate communicators over the ranks of `dp_cp` and
    /// `expt_dp`, so an all-gather can overlap a reduce-scatter.
    #[must_use]
    pub fn with_all_gather_groups(mut self, on: bool) -> Self {
        self.topology.all_gather_groups = on;
        self
    }

    /// Adds one more communicator over the groups of `kind`, told apart by `tag` (any number of tags per kind).
    #[must_use]
    pub fn with_tagged(mut self, kind: impl Into<String>, tag: impl Into<String>) -> Self {
        self.topology.tagged.push((kind.into(), tag.into()));
        self
    }

    /// Adds a custom kind: the groups of `grid` over `dims`.
    pub fn with_grid_groups<S: AsRef<str>>(
        mut self,
        kind: impl Into<String>,
        grid: Grid,
        dims: impl IntoIterator<Item = S>,
    ) -> Result<Self, CollectionError> {
        let kind = kind.into();
        let dims: DimSet = grid.select(dims).map_err(|e| CollectionError::Invalid {
            collection: self.name.clone(),
            what: format!("custom group kind {kind}: {e}"),
        })?;
        self.topology
            .custom
            .push((kind, CustomGroups::Grid { grid, dims }));
        Ok(self)
    }

    /// Adds a custom kind given as explicit, disjoint rank lists (a weight-sync group, say).
    #[must_use]
    pub fn with_explicit_groups(
        mut self,
        kind: impl Into<String>,
        groups: Vec<Vec<usize>>,
    ) -> Self {
        self.topology
            .custom
            .push((kind.into(), CustomGroups::Explicit(groups)));
        self
    }

    /// Per-kind communicator options.
    #[must_use]
    pub fn with_options(mut self, options: GroupOptions) -> Self {
        self.options = options;
        self
    }

    /// Eager (default) or lazy creation.
    #[must_use]
    pub fn with_creation(mut self, creation: Creation) -> Self {
        self.creation = creation;
        self
    }

    /// The backend of every communicator (default: host).
    #[must_use]
    pub fn with_backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// The default timeout of every communicator (default 300 s); per-kind options override it.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Host backend: use TCP even between ranks on one machine.
    #[must_use]
    pub fn with_force_tcp(mut self, on: bool) -> Self {
        self.force_tcp = on;
        self
    }

    fn prepare(&self, rank: usize) -> Result<Vec<Entry>, CollectionError> {
        self.topology.validate(&self.name)?;
        let kinds = self.topology.kind_names();
        self.options.check_kinds(kinds.iter().map(String::as_str))?;
        self.topology
            .plan(rank, &self.name)?
            .into_iter()
            .map(|slot| self.entry(slot))
            .collect()
    }

    fn entry(&self, slot: Slot) -> Result<Entry, CollectionError> {
        let group = slot.membership.as_ref().map_or(0, |m| m.group);
        let mut options = CommOptions {
            timeout: self.timeout,
            force_tcp: self.force_tcp,
            ..CommOptions::named(format!("{}/{}/{group}", self.name, slot.id))
        };
        if let Some(set) = self.options.get(&slot.id.kind) {
            options = set.apply(options)?;
        }
        options
            .validate_for(self.backend)
            .map_err(|source| CollectionError::Comm {
                collection: self.name.clone(),
                group: slot.id.clone(),
                source: Box::new(source),
            })?;
        Ok(Entry {
            id: slot.id,
            membership: slot.membership,
            options,
            comm: OnceLock::new(),
            init: Mutex::new(()),
        })
    }

    /// Builds the collection on `rank` with the store-keyed bootstrap: for each group it belongs to, the rank meets
    /// the other members under the key `collection/<name>/<kind>/<level>/<group>/<tag>`; ranks outside a group do
    /// no work for it.
    pub fn build(
        self,
        rank: usize,
        store: Arc<dyn Store>,
    ) -> Result<ProcessGroupCollection, CollectionError> {
        let entries = self.prepare(rank)?;
        let collection = ProcessGroupCollection {
            name: self.name,
            rank,
            entries,
            store: Some(store),
            backend: self.backend,
            topology: self.topology,
        };
        if self.creation == Creation::Eager {
            for entry in &collection.entries {
                if entry.membership.is_ok() {
                    collection.create(entry)?;
                }
            }
            collection.barrier_all()?;
        }
        Ok(collection)
    }

    /// Builds the collection by splitting `parent`, one split per group slot (color: the group's index; ranks
    /// outside every group of a slot pass no color). Every member of `parent` must call this. The rank is
    /// `parent`'s member id for this process.
    pub fn build_by_split(
        self,
        parent: &Communicator,
    ) -> Result<ProcessGroupCollection, CollectionError> {
        if self.creation == Creation::Lazy {
            return Err(CollectionError::Invalid {
                collection: self.name,
                what: "lazy creation needs the store-keyed bootstrap: a split is collective over the whole parent"
                    .into(),
            });
        }
        let rank = parent.ranks()[parent.rank()];
        let entries = self.prepare(rank)?;
        let parent_ranks: std::collections::HashSet<usize> =
            parent.ranks().iter().copied().collect();
        for entry in &entries {
            if let Ok(m) = &entry.membership {
                if let Some(missing) = m.members.iter().find(|r| !parent_ranks.contains(r)) {
                    return Err(CollectionError::Invalid {
                        collection: self.name.clone(),
                        what: format!(
                            "group {} needs rank {missing}, which the parent communicator {} (ranks {:?}) lacks",
                            entry.id,
                            parent.name(),
                            parent.ranks()
                        ),
                    });
                }
            }
        }
        for entry in &entries {
            let comm_err = |source| CollectionError::Comm {
                collection: self.name.clone(),
                group: entry.id.clone(),
                source: Box::new(source),
            };
            let color = match &entry.membership {
                Ok(m) => Some(
                    u32::try_from(m.group).map_err(|_| CollectionError::Invalid {
                        collection: self.name.clone(),
                        what: format!(
                            "group {} index {} does not fit a split color",
                            entry.id, m.group
                        ),
                    })?,
                ),
                Err(_) => None,
            };
            let key = entry.membership.as_ref().map_or(0, |m| m.index as i64);
            let child = parent
                .split_with(color, key, entry.options.clone())
                .map_err(comm_err)?;
            if let (Some(child), Ok(m)) = (child, &entry.membership) {
                if child.ranks() != m.members.as_slice() {
                    return Err(CollectionError::Invalid {
                        collection: self.name.clone(),
                        what: format!(
                            "splitting for {} gave members {:?}, expected {:?}: is the parent over the layout's ranks?",
                            entry.id,
                            child.ranks(),
                            m.members
                        ),
                    });
                }
                // Fresh OnceLock: set cannot fail.
                let _ = entry.comm.set(child);
            }
        }
        let collection = ProcessGroupCollection {
            name: self.name,
            rank,
            entries,
            store: None,
            backend: self.backend,
            topology: self.topology,
        };
        collection.barrier_all()?;
        Ok(collection)
    }
}

struct Entry {
    id: GroupId,
    membership: Result<Membership, &'static str>,
    options: CommOptions,
    comm: OnceLock<Communicator>,
    /// Serialises lazy creation of `comm`.
    init: Mutex<()>,
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
    name: String,
    rank: usize,
    entries: Vec<Entry>,
    store: Option<Arc<dyn Store>>,
    backend: BackendKind,
    topology: Topology,
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

impl ProcessGroupCollection {
    /// A builder for the groups of `layout`, namespaced by `name` (use a distinct name per model instance).
    pub fn for_layout(name: impl Into<String>, layout: ParallelLayout) -> CollectionBuilder {
        CollectionBuilder {
            topology: Topology {
                layout: Some(layout),
                ..Topology::default()
            },
            ..ProcessGroupCollection::custom(name)
        }
    }

    /// A builder without a layout: add custom kinds with [`CollectionBuilder::with_grid_groups`] and
    /// [`CollectionBuilder::with_explicit_groups`].
    pub fn custom(name: impl Into<String>) -> CollectionBuilder {
        CollectionBuilder {
            name: name.into(),
            topology: Topology::default(),
            options: GroupOptions::default(),
            creation: Creation::Eager,
            backend: BackendKind::Host,
            timeout: Duration::from_secs(300),
            force_tcp: false,
        }
    }

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

    /// The communicator of `group`, created now if the collection is lazy and this is its first use.
    pub fn get(&self, group: &GroupId) -> Result<&Communicator, CollectionError> {
        self.membership(group)?;
        let entry = self.entry(group)?;
        if let Some(comm) = entry.comm.get() {
            return Ok(comm);
        }
        self.create(entry)
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

    /// Creates `entry`'s communicator through the store, unless another thread already has.
    fn create<'a>(&'a self, entry: &'a Entry) -> Result<&'a Communicator, CollectionError> {
        let _guard = entry.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(comm) = entry.comm.get() {
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
        let comm = Communicator::new(
            self.backend,
            scoped,
            m.members.clone(),
            self.rank,
            entry.options.clone(),
        )
        .map_err(comm_err)?;
        Ok(entry.comm.get_or_init(|| comm))
    }

    fn barrier_all(&self) -> Result<(), CollectionError> {
        for entry in &self.entries {
            if let Some(comm) = entry.comm.get() {
                comm.barrier()
                    .and_then(hypercomm_comm::Work::wait)
                    .map_err(|source| CollectionError::Comm {
                        collection: self.name.clone(),
                        group: entry.id.clone(),
                        source: Box::new(source),
                    })?;
            }
        }
        Ok(())
    }
}
