//! What building a collection costs the rendezvous store, per rank, simulated for worlds far larger than this
//! machine can run.
//!
//! [`simulate_store_cost`] replays the store traffic of the store-keyed bootstrap for every group of every kind,
//! through one in-process [`MemoryStore`] with a [`CountingStore`] per simulated rank, using the same keys and
//! record formats as a real build: the group leader writes one record, which is its arrival; every other member
//! reads it and adds to the arrival counter (marking its arrival under a key of its own too in a group of more than
//! 31); the last to arrive writes the decision; every other member reads it. A test builds real
//! collections and checks the per-rank counts against this simulation. The upshot: a rank's requests grow with the
//! number of groups it is in, and not at all with the world; its bytes grow only by the digits of group indices
//! written in communicator names.

use std::collections::HashSet;
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

/// The bootstrap record a leader writes, shaped as on this machine (host identity, pid, segment socket name).
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
    format!("{identity}\n{pid}\nhypercomm/{pid}/{:016x}", u64::MAX).into_bytes()
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
    let wait = Duration::from_secs(1);
    let store_err = |source| CollectionError::Invalid {
        collection: name.to_owned(),
        what: format!("simulated store failed: {source}"),
    };
    replay(name, layout, all_gather_groups, |members, requests| {
        for request in requests {
            let store = &ranks[request.rank - offset];
            match &request.op {
                Op::Set(value) => store.set(&request.key, value).map_err(store_err)?,
                Op::Get(_) => drop(store.get(&request.key, wait).map_err(store_err)?),
                Op::Add => drop(store.add(&request.key, 1).map_err(store_err)?),
            }
        }
        for &r in members {
            groups_per_rank[r - offset] += 1;
        }
        // Done with this group: free its keys (not counted) so memory stays bounded.
        for request in requests {
            if !matches!(request.op, Op::Get(_)) {
                shared.delete(&request.key).map_err(store_err)?;
            }
        }
        Ok(())
    })?;
    Ok(CostReport {
        world,
        per_rank: ranks.iter().map(CountingStore::counts).collect(),
        groups_per_rank,
    })
}

/// One request of the simulated bootstrap.
#[derive(Debug)]
struct Request {
    rank: usize,
    op: Op,
    key: Key,
}

#[derive(Debug)]
enum Op {
    /// Write this value.
    Set(Vec<u8>),
    /// Wait for the key and read a value of this many bytes.
    Get(usize),
    /// Add 1 to the counter.
    Add,
}

/// Groups larger than this also mark each arrival under a key of its own (the host bootstrap's threshold: up to
/// it, the arrival counter's bits say who arrived).
const ARRIVAL_BIT_RANKS: usize = 31;

/// Replays the store-keyed bootstrap group by group: for each group of each kind, its members and the requests
/// they send, in an order a real build can take. The leader writes one record (its arrival); every other member
/// reads it and adds to the arrival counter (and, in a group of more than 31, marks its arrival); the last to
/// arrive writes the decision; every other member reads it. A group of one makes no request.
fn replay(
    name: &str,
    layout: &ParallelLayout,
    all_gather_groups: bool,
    mut each_group: impl FnMut(&[usize], &[Request]) -> Result<(), CollectionError>,
) -> Result<(), CollectionError> {
    let topology = Topology {
        layout: Some(layout.clone()),
        all_gather_groups,
        ..Topology::default()
    };
    let record = leader_record();
    let layout_err = |source| CollectionError::Layout {
        collection: name.to_owned(),
        source,
    };
    let mut requests = Vec::new();
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
            requests.clear();
            let mut push = |rank, op, key| requests.push(Request { rank, op, key });
            // A group of one makes no request.
            if members.len() > 1 {
                push(members[0], Op::Set(record.clone()), key("leader"));
                for &r in &members[1..] {
                    push(r, Op::Get(record.len()), key("leader"));
                }
                for (i, &r) in members.iter().enumerate().skip(1) {
                    push(r, Op::Add, key("arrivals"));
                    if members.len() > ARRIVAL_BIT_RANKS {
                        push(r, Op::Set(Vec::new()), key("arrived").push(i));
                    }
                    if i + 1 == members.len() {
                        push(r, Op::Set(b"shm".to_vec()), key("decision"));
                    }
                }
                for &r in &members[..members.len() - 1] {
                    push(r, Op::Get(3), key("decision"));
                }
            }
            each_group(&members, &requests)?;
        }
    }
    Ok(())
}

/// The store traffic of a collection build when every node's ranks go through a relay
/// ([`StoreRelay`](hypercomm_store::StoreRelay)): what each node's relay receives from its ranks and sends to the
/// central store, and what the central store receives in all.
#[derive(Debug, Clone)]
pub struct RelayCostReport {
    /// The number of ranks.
    pub world: usize,
    /// Ranks per node (consecutive ranks share a node, as the launcher places them).
    pub ranks_per_node: usize,
    /// Per node: the requests and bytes its ranks send to the relay.
    pub local: Vec<StoreCounts>,
    /// Per node: the requests and bytes the relay sends upstream, when the identical gets of a group's members
    /// on one node overlap in time (as they do when the members start together) and so share one upstream call.
    pub upstream: Vec<StoreCounts>,
}

impl RelayCostReport {
    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.local.len()
    }

    /// Requests the central store receives without relays (every rank's own requests).
    pub fn direct_requests(&self) -> u64 {
        self.local.iter().map(StoreCounts::requests).sum()
    }

    /// Requests the central store receives through the relays.
    pub fn central_requests(&self) -> u64 {
        self.upstream.iter().map(StoreCounts::requests).sum()
    }

    /// Bytes (both directions) the central store moves through the relays.
    pub fn central_bytes(&self) -> u64 {
        self.upstream.iter().map(StoreCounts::bytes).sum()
    }

    /// The most requests one relay sends upstream.
    pub fn max_upstream_requests(&self) -> u64 {
        self.upstream
            .iter()
            .map(StoreCounts::requests)
            .max()
            .unwrap_or(0)
    }

    /// The most bytes one relay moves upstream.
    pub fn max_upstream_bytes(&self) -> u64 {
        self.upstream
            .iter()
            .map(StoreCounts::bytes)
            .max()
            .unwrap_or(0)
    }

    /// The most requests one relay receives from its ranks.
    pub fn max_local_requests(&self) -> u64 {
        self.local
            .iter()
            .map(StoreCounts::requests)
            .max()
            .unwrap_or(0)
    }
}

/// Simulates the store traffic of building the collection `name` over `layout` on every rank, with each node of
/// `ranks_per_node` consecutive ranks reaching the central store through its relay. Counts requests only (no
/// store is run), so it goes to a million ranks in seconds; [`simulate_store_cost`] runs the same requests
/// through a store and is checked against real builds.
pub fn simulate_relay_cost(
    name: &str,
    layout: &ParallelLayout,
    all_gather_groups: bool,
    ranks_per_node: usize,
) -> Result<RelayCostReport, CollectionError> {
    if ranks_per_node == 0 {
        return Err(CollectionError::Invalid {
            collection: name.to_owned(),
            what: "ranks_per_node=0: a node holds at least one rank".into(),
        });
    }
    let world = layout.world();
    let offset = layout.ranks().start;
    let nodes = world.div_ceil(ranks_per_node);
    let mut local = vec![StoreCounts::default(); nodes];
    let mut upstream = vec![StoreCounts::default(); nodes];
    // Per group: the (node, key) pairs already fetched upstream, so later identical gets share the call.
    let mut fetched: HashSet<(usize, usize)> = HashSet::new();
    replay(name, layout, all_gather_groups, |_, requests| {
        fetched.clear();
        // Gets of one key are identical requests: number the group's distinct keys to tell them apart cheaply.
        let mut keys: Vec<&Key> = Vec::new();
        for request in requests {
            let node = (request.rank - offset) / ranks_per_node;
            let key_len = request.key.encoded_len() as u64;
            let shared = match &request.op {
                Op::Get(_) => {
                    let id = keys
                        .iter()
                        .position(|k| **k == request.key)
                        .unwrap_or_else(|| {
                            keys.push(&request.key);
                            keys.len() - 1
                        });
                    !fetched.insert((node, id))
                }
                Op::Set(_) | Op::Add => false,
            };
            for (counts, counted) in [(&mut local[node], true), (&mut upstream[node], !shared)] {
                if !counted {
                    continue;
                }
                counts.bytes_sent += key_len;
                match &request.op {
                    Op::Set(value) => {
                        counts.sets += 1;
                        counts.bytes_sent += value.len() as u64;
                    }
                    Op::Get(len) => {
                        counts.gets += 1;
                        counts.bytes_received += *len as u64;
                    }
                    Op::Add => {
                        // An 8-byte delta out, the 8-byte counter back, as a counting store reckons it.
                        counts.adds += 1;
                        counts.bytes_sent += 8;
                        counts.bytes_received += 8;
                    }
                }
            }
        }
        Ok(())
    })?;
    Ok(RelayCostReport {
        world,
        ranks_per_node,
        local,
        upstream,
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
    fn relays_forward_every_rank_request_except_shared_gets() {
        let layout = LayoutConfig::new(256)
            .tp(8)
            .pp(2)
            .cp(2)
            .ep(2)
            .build()
            .unwrap();
        let direct = simulate_store_cost("sim", &layout, true).unwrap();
        let relayed = simulate_relay_cost("sim", &layout, true, 8).unwrap();
        assert_eq!(relayed.nodes(), 32);
        // What each relay receives is exactly what its ranks send (checked against the store-run simulation).
        for (node, local) in relayed.local.iter().enumerate() {
            let ranks = &direct.per_rank[node * 8..node * 8 + 8];
            let requests: u64 = ranks.iter().map(StoreCounts::requests).sum();
            let bytes: u64 = ranks.iter().map(StoreCounts::bytes).sum();
            assert_eq!(
                (local.requests(), local.bytes()),
                (requests, bytes),
                "node {node}"
            );
        }
        // Upstream, writes and adds pass one for one; gets shrink (tp 8 fills a node: its gets become one each).
        for (local, upstream) in relayed.local.iter().zip(&relayed.upstream) {
            assert_eq!((upstream.sets, upstream.adds), (local.sets, local.adds));
            assert!(upstream.gets < local.gets, "{upstream:?} vs {local:?}");
        }
        assert!(relayed.central_requests() < relayed.direct_requests());
        // One rank per node: nothing to share, the relays forward everything.
        let alone = simulate_relay_cost("sim", &layout, true, 1).unwrap();
        assert_eq!(alone.central_requests(), alone.direct_requests());
        assert!(simulate_relay_cost("sim", &layout, true, 0).is_err());
    }

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
        // From 512 ranks on, every group whose size grows with the world (dp and the kinds over it) has more than
        // 31 ranks and so marks arrivals: the count stays put from there. Below, such groups are small enough for
        // the arrival counter's bits and cost a request less each.
        let tiny = cost(64);
        let small = cost(512);
        let large = cost(1024);
        assert_eq!(tiny.max_groups(), large.max_groups());
        assert_eq!(small.max_groups(), large.max_groups());
        assert_eq!(small.max_requests(), large.max_requests());
        assert!(tiny.max_requests() < large.max_requests());
        // Bytes differ only through the group index written in decimal in communicator names (a few more digits
        // in a larger world): at most 4 requests per group, each a few digits longer.
        let groups = large.max_groups() as u64;
        assert!(large.max_bytes() >= small.max_bytes());
        assert!(
            large.max_bytes() <= small.max_bytes() + 4 * 4 * groups,
            "{} vs {}",
            large.max_bytes(),
            small.max_bytes()
        );
        // A rank makes at most 4 requests per group (3 in groups of up to 31, 2 where it leads), and one add per
        // group it joins without leading it.
        for (counts, &groups) in large.per_rank.iter().zip(&large.groups_per_rank) {
            assert!(counts.adds <= groups as u64, "{counts:?}");
            assert!(counts.requests() <= 4 * groups as u64, "{counts:?}");
        }
    }
}
