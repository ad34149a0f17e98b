//! What building a collection costs the rendezvous store, per rank, simulated for worlds far larger than this
//! machine can run.
//!
//! [`simulate_store_cost`] replays the store traffic of the store-keyed bootstrap for every group of every kind,
//! through one in-process [`MemoryStore`] with a [`CountingStore`] per simulated rank, using the same keys and
//! record formats as a real build: the group leader writes one record; every other member reads it; every member
//! marks its arrival and adds to the arrival counter; the last to arrive writes the decision; every member reads
//! it. A test builds real
//! collections and checks the per-rank counts against this simulation. The upshot: a rank's requests grow with the
//! number of groups it is in, and not at all with the world; its bytes grow only by the digits of group indices
//! written in communicator names.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_grid::Membership;
use hypercomm_grid::layout::{GroupKind, ParallelLayout};
use hypercomm_store::{CountingStore, Key, MemoryStore, Store, StoreCounts};

use crate::plan::Topology;
use crate::{CollectionError, GroupId};

/// The simulated store traffic of building one collection on every rank.
#[derive(Debug, Clone)]
pub struct CostReport {
    /// The number of ranks.
    pub world: usize,
    /// Per rank (in layout order): the store traffic.
    pub per_rank: Vec<StoreCounts>,
    /// Per rank: the number of communicators it joins.
    pub groups_per_rank: Vec<usize>,
}

impl CostReport {
    /// The largest per-rank request count.
    pub fn max_requests(&self) -> u64 {
        self.per_rank
            .iter()
            .map(StoreCounts::requests)
            .max()
            .unwrap_or(0)
    }

    /// The largest per-rank byte count (both directions).
    pub fn max_bytes(&self) -> u64 {
        self.per_rank
            .iter()
            .map(StoreCounts::bytes)
            .max()
            .unwrap_or(0)
    }

    /// The largest number of communicators one rank joins.
    pub fn max_groups(&self) -> usize {
        self.groups_per_rank.iter().copied().max().unwrap_or(0)
    }
}

/// The bootstrap record a leader writes, shaped as on this machine (host identity, pid, segment path).
fn leader_record() -> Vec<u8> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let identity = format!(
        "{}/{}",
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/sys/kernel/hostname")
    );
    let pid = std::process::id();
    format!(
        "{identity}\n{pid}\n/dev/shm/hypercomm-{pid}-{:016x}-{:012x}",
        u64::MAX,
        u64::MAX >> 16
    )
    .into_bytes()
}

/// Simulates the store traffic of building the collection `name` over `layout` on every rank (store-keyed
/// bootstrap, all ranks on one host), with `dp_cp_ag`/`expt_dp_ag` when `all_gather_groups`.
pub fn simulate_store_cost(
    name: &str,
    layout: &ParallelLayout,
    all_gather_groups: bool,
) -> Result<CostReport, CollectionError> {
    let world = layout.world();
    let offset = layout.ranks().start;
    let shared = Arc::new(MemoryStore::new());
    let ranks: Vec<CountingStore<Arc<MemoryStore>>> = (0..world)
        .map(|_| CountingStore::new(Arc::clone(&shared)))
        .collect();
    let mut groups_per_rank = vec![0usize; world];
    let topology = Topology {
        layout: Some(layout.clone()),
        all_gather_groups,
        ..Topology::default()
    };
    let record = leader_record();
    let wait = Duration::from_secs(1);
    let layout_err = |source| CollectionError::Layout {
        collection: name.to_owned(),
        source,
    };
    for kind in topology.layout_kinds() {
        let groups = layout.groups(kind).map_err(layout_err)?;
        let mut members = Vec::new();
        for group in groups {
            members.clear();
            members.extend(group);
            // The group's id and index as its first member's collection would see them.
            let (level, m) = membership_of(layout, kind, &members)
                .map_err(layout_err)?
                .ok_or_else(|| CollectionError::Invalid {
                    collection: name.to_owned(),
                    what: format!("{kind} group {members:?} is not its first member's group"),
                })?;
            let id = GroupId {
                kind: kind.name().to_owned(),
                level,
                tag: String::new(),
            };
            let prefix = Key::new("collection")
                .push(name)
                .push(id.kind.as_str())
                .push(level)
                .push(m.group)
                .push(id.tag.as_str());
            let comm = Key::new("comm").push(format!("{name}/{id}/{}", m.group));
            let key = |what: &str| prefix.join(&comm.clone().push(what));
            let store_err = |source| CollectionError::Invalid {
                collection: name.to_owned(),
                what: format!("simulated store failed: {source}"),
            };
            let rank_store = |r: usize| &ranks[r - offset];
            rank_store(members[0])
                .set(&key("leader"), &record)
                .map_err(store_err)?;
            for &r in &members[1..] {
                rank_store(r).get(&key("leader"), wait).map_err(store_err)?;
            }
            for (i, &r) in members.iter().enumerate() {
                let arrived = key("arrived").push(i);
                rank_store(r).set(&arrived, b"").map_err(store_err)?;
                rank_store(r).add(&key("arrivals"), 1).map_err(store_err)?;
                if i + 1 == members.len() {
                    rank_store(r)
                        .set(&key("decision"), b"shm")
                        .map_err(store_err)?;
                }
            }
            for &r in &members {
                rank_store(r)
                    .get(&key("decision"), wait)
                    .map_err(store_err)?;
                groups_per_rank[r - offset] += 1;
            }
            // Done with this group: free its keys (not counted) so memory stays bounded.
            for what in ["leader", "arrivals", "decision"] {
                shared.delete(&key(what)).map_err(store_err)?;
            }
            for i in 0..members.len() {
                shared.delete(&key("arrived").push(i)).map_err(store_err)?;
            }
        }
    }
    Ok(CostReport {
        world,
        per_rank: ranks.iter().map(CountingStore::counts).collect(),
        groups_per_rank,
    })
}

/// The level and membership (as its first member sees it) of `members`, a group of `kind`; `None` when the layout's
/// direct computation disagrees with its enumeration (a bug the simulation must report, not paper over).
fn membership_of(
    layout: &ParallelLayout,
    kind: GroupKind,
    members: &[usize],
) -> Result<Option<(usize, Membership)>, hypercomm_grid::layout::LayoutError> {
    Ok(layout
        .memberships(members[0], kind)?
        .into_iter()
        .enumerate()
        .find(|(_, m)| m.members == members))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_grid::layout::LayoutConfig;

    #[test]
    fn per_rank_cost_does_not_grow_with_the_world() {
        let cost = |world| {
            let layout = LayoutConfig::new(world)
                .tp(2)
                .pp(2)
                .cp(2)
                .ep(2)
                .build()
                .unwrap();
            simulate_store_cost("sim", &layout, true).unwrap()
        };
        let small = cost(64);
        let large = cost(1024);
        assert_eq!(small.max_groups(), large.max_groups());
        assert_eq!(small.max_requests(), large.max_requests());
        // Bytes differ only through the group index written in decimal in communicator names (a few more digits
        // in a larger world): at most 5 requests per group, each a few digits longer.
        let groups = large.max_groups() as u64;
        assert!(large.max_bytes() >= small.max_bytes());
        assert!(
            large.max_bytes() <= small.max_bytes() + 5 * 4 * groups,
            "{} vs {}",
            large.max_bytes(),
            small.max_bytes()
        );
        // Every rank makes one add and at least one get per group, and at most 5 requests per group.
        for (counts, &groups) in large.per_rank.iter().zip(&large.groups_per_rank) {
            assert_eq!(counts.adds, groups as u64);
            assert!(counts.requests() <= 5 * groups as u64, "{counts:?}");
        }
    }
}
