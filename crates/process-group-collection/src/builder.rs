//! [`CollectionBuilder`]: what a collection holds (layout kinds, twins, tags, custom kinds, the world group),
//! with which options, on which GPU, and the two bootstraps that build it: store-keyed and by split.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommOptions, Communicator, FailureDomain, StepHook};
use hypercomm_grid::layout::ParallelLayout;
use hypercomm_grid::{DimSet, Grid};
use hypercomm_store::{Key, Store};

use crate::collection::{Entry, ProcessGroupCollection, WORLD};
use crate::plan::{CustomGroups, Slot, Topology};
use crate::{BuildHook, BuildStep, CollectionError, GroupOptions};

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
    pub(crate) name: String,
    pub(crate) topology: Topology,
    pub(crate) options: GroupOptions,
    pub(crate) creation: Creation,
    pub(crate) timeout: Duration,
    pub(crate) force_tcp: bool,
    pub(crate) gpu: Option<Arc<Gpu>>,
    pub(crate) world_group: bool,
    pub(crate) hook: Option<BuildHook>,
}

impl CollectionBuilder {
    /// Gives every group's communicator a GPU: an NCCL flavor on `gpu` besides its host one, so each group takes
    /// device buffers as well as host vectors. Each kind's NCCL options from [`with_options`](Self::with_options) go to
    /// its `ncclConfig_t` and stream; all-gather twins and tagged communicators get NCCL communicators (and
    /// streams) of their own. Checked before anything is created: a knob the loaded NCCL cannot honour is an error
    /// naming the group and the knob.
    #[must_use]
    pub fn with_gpu(mut self, gpu: Arc<Gpu>) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Also create `dp_cp_ag` (and `expt_dp_ag` when ep > 1): separate communicators over the ranks of `dp_cp` and
    /// `expt_dp`, so an all-gather can overlap a reduce-scatter.
    #[must_use]
    pub fn with_all_gather_groups(mut self, on: bool) -> Self {
        self.topology.all_gather_groups = on;
        self
    }

    /// Also create `world`: one group of every rank of the layout (its offset included), for what spans the whole
    /// model instance (a start-up barrier, a loss all-reduce, checkpoint coordination). Reach it with
    /// [`ProcessGroupCollection::world`]. Needs a layout.
    #[must_use]
    pub fn with_world_group(mut self, on: bool) -> Self {
        self.world_group = on;
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

    /// Calls `hook` at every named step of the build: each group's communicator bootstrap, each group created,
    /// the end (see [`BuildStep`]). For fault injection: the hook may stall, panic or end the process. It is passed
    /// to every group's communicator options (nothing global), so it also sees the bootstraps of lazily created
    /// groups.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use hypercomm_grid::layout::LayoutConfig;
    /// use hypercomm_store::{MemoryStore, Store};
    /// use process_group_collection::{BuildStep, ProcessGroupCollection};
    ///
    /// let layout = LayoutConfig::new(4).tp(2).build()?;
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// # let rank = 0;
    /// let pgc = ProcessGroupCollection::for_layout("chaos", layout)
    ///     .with_step_hook(move |step: &BuildStep<'_>| {
    ///         // Kill rank 0 right after it created the dp group's shared memory.
    ///         if rank == 0 && step.name() == "segment_created" && step.group().is_some_and(|g| g.kind == "dp") {
    ///             std::process::abort();
    ///         }
    ///     })
    ///     .build(rank, store)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_step_hook(mut self, hook: impl Fn(&BuildStep<'_>) + Send + Sync + 'static) -> Self {
        self.hook = Some(BuildHook::new(hook));
        self
    }

    fn prepare(&mut self, rank: usize) -> Result<Vec<Entry>, CollectionError> {
        if self.world_group && !self.topology.custom.iter().any(|(k, _)| k == WORLD) {
            let Some(layout) = &self.topology.layout else {
                return Err(CollectionError::Invalid {
                    collection: self.name.clone(),
                    what: "with_world_group needs a layout: the world is the layout's ranks".into(),
                });
            };
            let everyone = vec![layout.ranks().collect()];
            self.topology
                .custom
                .push((WORLD.to_owned(), CustomGroups::Explicit(everyone)));
        }
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
        if let Some(hook) = &self.hook {
            let (hook, group) = (hook.clone(), slot.id.clone());
            options.on_step = Some(StepHook::new(move |step| {
                hook.call(&BuildStep::Comm {
                    group: &group,
                    step,
                });
            }));
        }
        let comm_err = |source| CollectionError::Comm {
            collection: self.name.clone(),
            group: slot.id.clone(),
            source: Box::new(source),
        };
        // With a GPU, the NCCL knobs go to the NCCL flavor; without one, a knob would be lost: refused.
        Communicator::check_options(self.gpu.as_deref(), &options).map_err(comm_err)?;
        Ok(Entry {
            id: slot.id,
            membership: slot.membership,
            options,
            group: OnceLock::new(),
            init: Mutex::new(()),
        })
    }

    /// Builds the collection on `rank` with the store-keyed bootstrap: for each group it belongs to, the rank meets
    /// the other members under the key `collection/<name>/<kind>/<level>/<group>/<tag>`; ranks outside a group do
    /// no work for it.
    pub fn build(
        mut self,
        rank: usize,
        store: Arc<dyn Store>,
    ) -> Result<ProcessGroupCollection, CollectionError> {
        let mut entries = self.prepare(rank)?;
        // One failure domain for every communicator of the collection on this rank: a failure in one records its
        // root cause under the collection's key and aborts them all (see `FailureDomain`).
        let domain = FailureDomain::new(
            Arc::clone(&store),
            Key::new("collection")
                .push(self.name.as_str())
                .push("failures"),
            rank,
        );
        for entry in &mut entries {
            // Both flavors of each communicator join it: a failure of either aborts every communicator of the rank.
            entry.options.failure_domain = Some(Arc::clone(&domain));
        }
        let collection = ProcessGroupCollection {
            name: self.name,
            rank,
            entries,
            store: Some(store),
            topology: self.topology,
            gpu: self.gpu,
        };
        if self.creation == Creation::Eager {
            for entry in &collection.entries {
                if entry.membership.is_ok() {
                    collection.create(entry)?;
                    collection.step(self.hook.as_ref(), Some(&entry.id));
                }
            }
            collection.barrier_all()?;
            collection.step(self.hook.as_ref(), None);
        }
        Ok(collection)
    }

    /// Builds the collection by splitting `parent`, one split per group slot (color: the group's index; ranks
    /// outside every group of a slot pass no color), with one all-gather on `parent` for every slot's color
    /// ([`Communicator::split_many`]). Every member of `parent` must call this. The rank is `parent`'s member id
    /// for this process. When `parent` has a GPU, each child's NCCL flavor is split from the parent's
    /// (`ncclCommSplit`, a kind's `split_share` option honoured); a builder given a GPU needs a parent with one.
    pub fn build_by_split(
        self,
        parent: &Communicator,
    ) -> Result<ProcessGroupCollection, CollectionError> {
        match (&self.gpu, parent.gpu()) {
            (Some(gpu), Some(theirs)) if gpu.ordinal() != theirs.ordinal() => {
                Err(CollectionError::Invalid {
                    collection: self.name,
                    what: format!(
                        "the collection's gpu is device {} but the parent communicator {} is on device {}",
                        gpu.ordinal(),
                        parent.name(),
                        theirs.ordinal()
                    ),
                })
            }
            (Some(_), None) => Err(CollectionError::Invalid {
                collection: self.name,
                what: format!(
                    "the collection has a gpu but the parent communicator {} has none: split a parent made \
                     with_gpu",
                    parent.name()
                ),
            }),
            _ => self.split_from(parent),
        }
    }

    fn split_from(
        mut self,
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
        // The children have the parent's flavors: with a GPU there, the options are checked against it.
        if self.gpu.is_none() {
            self.gpu = parent.gpu().cloned();
        }
        let mut entries = self.prepare(rank)?;
        // The children fail together with the parent: one failure domain, the parent's, records the root cause
        // and aborts every communicator of the collection on this rank (the store-keyed build makes one under the
        // collection's key instead).
        for entry in &mut entries {
            entry
                .options
                .failure_domain
                .get_or_insert_with(|| Arc::clone(parent.failure_domain()));
        }
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
        // Every slot's color and key first, so that one all-gather on the parent serves every split.
        let mut splits = Vec::with_capacity(entries.len());
        for entry in &entries {
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
            splits.push((color, key, entry.options.clone()));
        }
        // A failure of the all-gather is the first split's: the one a split-by-split build would have failed in
        // (without slots there is no all-gather to fail).
        let mut children = parent
            .split_many(splits)
            .map_err(|source| CollectionError::Comm {
                collection: self.name.clone(),
                group: entries
                    .first()
                    .map_or_else(|| crate::GroupId::kind(""), |e| e.id.clone()),
                source: Box::new(source),
            })?;
        for entry in &entries {
            let comm_err = |source| CollectionError::Comm {
                collection: self.name.clone(),
                group: entry.id.clone(),
                source: Box::new(source),
            };
            // As many children as entries: the iterator ends only after the last.
            let child = children.next().transpose().map_err(comm_err)?.flatten();
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
                let _ = entry.group.set(child);
                if let Some(hook) = &self.hook {
                    hook.call(&BuildStep::GroupCreated {
                        collection: &self.name,
                        group: &entry.id,
                    });
                }
            }
        }
        let collection = ProcessGroupCollection {
            name: self.name,
            rank,
            entries,
            store: None,
            topology: self.topology,
            gpu: self.gpu,
        };
        collection.barrier_all()?;
        collection.step(self.hook.as_ref(), None);
        Ok(collection)
    }
}

impl ProcessGroupCollection {
    /// Runs `hook`, if any, at `group_created` for `group`, or at `built` without one.
    fn step(&self, hook: Option<&BuildHook>, group: Option<&crate::GroupId>) {
        let Some(hook) = hook else { return };
        hook.call(&match group {
            Some(group) => BuildStep::GroupCreated {
                collection: &self.name,
                group,
            },
            None => BuildStep::Built {
                collection: &self.name,
            },
        });
    }

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
            timeout: Duration::from_secs(300),
            force_tcp: false,
            gpu: None,
            world_group: false,
            hook: None,
        }
    }
}
