//! [`Cluster`]: a checked [`ClusterSpec`] turned into a petgraph graph of hosts, GPUs, NVLink domains, NICs and
//! racks, whose edges carry a [`LinkClass`] and a bandwidth, and the link class between any two GPUs.
//!
//! The graph has one node per GPU, per host (its PCIe root), per NVLink domain (its NVSwitch), per leaf switch
//! (one per rack, or a single one without racks) and one spine node when racks are given. Edges:
//! GPU–NVSwitch ([`LinkClass::Nvlink`]), GPU–host ([`LinkClass::Pcie`]), host–leaf ([`LinkClass::Nic`], the host's
//! NICs together) and leaf–spine ([`LinkClass::Spine`]). The class between two GPUs is the smallest class `c` such
//! that the edges of class at most `c` connect them: the path whose slowest link is fastest.

use petgraph::graph::{NodeIndex, UnGraph};
use petgraph::unionfind::UnionFind;
use serde::{Deserialize, Serialize};

use crate::error::TopologyError;
use crate::link::LinkClass;
use crate::spec::{Bandwidths, ClusterSpec, Host, check_bandwidth, check_hosts, check_placement};

/// A node of the cluster graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// A GPU: host index and device index on the host.
    Device {
        /// The host's index.
        host: usize,
        /// The GPU's index on its host.
        device: usize,
    },
    /// A host's PCIe root.
    Host(usize),
    /// An NVLink domain's switch.
    NvSwitch(usize),
    /// A leaf switch: one per rack, or one for the cluster without racks.
    Leaf(usize),
    /// The spine joining the racks.
    Spine,
}

/// An edge of the cluster graph.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// The class of link.
    pub class: LinkClass,
    /// Its bandwidth in GB/s, one direction (a host's NICs together on a host–leaf edge).
    pub bandwidth: f64,
}

/// A checked cluster: hosts, the graph of its links, and the link class between any two GPUs.
///
/// GPUs have flat indices `0..devices()`, host by host in the order the hosts are listed.
///
/// ```
/// use hypercomm_plan::{Cluster, LinkClass};
///
/// let cluster = Cluster::from_json(r#"{
///     "bandwidth": {"nvlink": 450, "nic": 50},
///     "hosts": [
///         {"name": "a", "gpus": 8, "nics": 8, "nvlink_domain": "a"},
///         {"name": "b", "gpus": 8, "nics": 8, "nvlink_domain": "b"}
///     ]
/// }"#)?;
/// assert_eq!(cluster.devices(), 16);
/// assert_eq!(cluster.class_between(0, 7), LinkClass::Nvlink);
/// assert_eq!(cluster.class_between(7, 8), LinkClass::Nic);
/// # Ok::<(), hypercomm_plan::TopologyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Cluster {
    spec: ClusterSpec,
    bandwidth: Bandwidths,
    hosts: Vec<Host>,
    device_host: Vec<usize>,
    graph: UnGraph<Node, Link>,
    /// `labels[level][device]`: the device's connected component using edges of class at most `level`.
    labels: Vec<Vec<usize>>,
    /// `largest[level]`: the most devices in one component at that level.
    largest: Vec<usize>,
    placement: Option<Vec<usize>>,
}

impl PartialEq for Cluster {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl Cluster {
    /// Parses and checks a JSON description ([`ClusterSpec`]).
    pub fn from_json(text: &str) -> Result<Cluster, TopologyError> {
        let spec: ClusterSpec = serde_json::from_str(text)
            .map_err(|e| TopologyError::BadJson { why: e.to_string() })?;
        Cluster::new(spec)
    }

    /// Checks `spec` and builds the graph.
    pub fn new(spec: ClusterSpec) -> Result<Cluster, TopologyError> {
        let hosts = check_hosts(&spec)?;
        let bandwidth = check_bandwidth(&spec, &hosts)?;
        let device_host: Vec<usize> = hosts
            .iter()
            .enumerate()
            .flat_map(|(h, host)| std::iter::repeat_n(h, host.gpus))
            .collect();
        let graph = build_graph(&hosts, &bandwidth);
        let (labels, largest) = components(&graph, device_host.len());
        let top = &labels[LinkClass::Spine.level()];
        if let Some(device) = (0..device_host.len()).find(|&d| top[d] != top[0]) {
            return Err(TopologyError::Unreachable {
                host: hosts[device_host[device]].name.clone(),
                other: hosts[0].name.clone(),
            });
        }
        let placement = match &spec.placement {
            None => None,
            Some(entries) => Some(check_placement(entries, &hosts)?),
        };
        Ok(Cluster {
            spec,
            bandwidth,
            hosts,
            device_host,
            graph,
            labels,
            largest,
            placement,
        })
    }

    /// The description this cluster was built from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The cluster's name (may be empty).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// What the NICs speak, for explanations (`the network` when not given).
    pub fn fabric(&self) -> &str {
        self.spec.fabric.as_deref().unwrap_or("the network")
    }

    /// The hosts, in the order listed.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The number of GPUs.
    pub fn devices(&self) -> usize {
        self.device_host.len()
    }

    /// The host index of GPU `device` (a flat index below [`Cluster::devices`]).
    pub fn host_of(&self, device: usize) -> usize {
        self.device_host[device]
    }

    /// The resolved bandwidths.
    pub fn bandwidth(&self) -> Bandwidths {
        self.bandwidth
    }

    /// The bandwidth in GB/s of one link of `class`, before any sharing (infinite for [`LinkClass::SameDevice`]).
    pub fn class_bandwidth(&self, class: LinkClass) -> f64 {
        let b = self.bandwidth;
        match class {
            LinkClass::SameDevice => f64::INFINITY,
            LinkClass::Nvlink => b.nvlink,
            LinkClass::Pcie => b.pcie,
            LinkClass::Nic => b.nic.min(b.pcie),
            LinkClass::Spine => b.spine.min(b.nic).min(b.pcie),
        }
    }

    /// The graph of hosts, GPUs, switches and links.
    pub fn graph(&self) -> &UnGraph<Node, Link> {
        &self.graph
    }

    /// The explicit placement from the description, as flat device indices per rank.
    pub fn explicit_placement(&self) -> Option<&[usize]> {
        self.placement.as_deref()
    }

    /// Whether every host has the same number of GPUs.
    pub fn is_homogeneous(&self) -> bool {
        self.hosts.iter().all(|h| h.gpus == self.hosts[0].gpus)
    }

    /// The class of the best path between GPUs `a` and `b` (flat indices).
    pub fn class_between(&self, a: usize, b: usize) -> LinkClass {
        self.class_of(&[a, b])
    }

    /// The class of the slowest link that some pair of `devices` must cross: the smallest class whose links
    /// connect them all. [`LinkClass::SameDevice`] for fewer than two distinct devices.
    pub fn class_of(&self, devices: &[usize]) -> LinkClass {
        let Some(&first) = devices.first() else {
            return LinkClass::SameDevice;
        };
        LinkClass::ALL
            .into_iter()
            .find(|c| {
                let labels = &self.labels[c.level()];
                devices.iter().all(|&d| labels[d] == labels[first])
            })
            .unwrap_or(LinkClass::Spine)
    }

    /// Every class some pair of `devices` crosses as its best path's class, fastest first.
    pub fn classes_spanned(&self, devices: &[usize]) -> Vec<LinkClass> {
        let mut spanned = Vec::new();
        let mut previous = distinct(devices.iter().copied());
        for class in LinkClass::ALL {
            let labels = &self.labels[class.level()];
            let now = distinct(devices.iter().map(|&d| labels[d]));
            if now < previous {
                spanned.push(class);
            }
            previous = now;
        }
        spanned
    }

    /// The fastest class within which some `size` GPUs of this cluster can all meet.
    pub fn best_class_for(&self, size: usize) -> LinkClass {
        if size <= 1 {
            return LinkClass::SameDevice;
        }
        LinkClass::ALL
            .into_iter()
            .find(|c| self.largest[c.level()] >= size)
            .unwrap_or(LinkClass::Spine)
    }
}

fn distinct(values: impl Iterator<Item = usize>) -> usize {
    let mut v: Vec<usize> = values.collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

impl TryFrom<ClusterSpec> for Cluster {
    type Error = TopologyError;
    fn try_from(spec: ClusterSpec) -> Result<Self, TopologyError> {
        Cluster::new(spec)
    }
}

impl From<Cluster> for ClusterSpec {
    fn from(cluster: Cluster) -> Self {
        cluster.spec
    }
}

impl Serialize for Cluster {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.spec.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Cluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = ClusterSpec::deserialize(deserializer)?;
        Cluster::new(spec).map_err(serde::de::Error::custom)
    }
}

fn build_graph(hosts: &[Host], bw: &Bandwidths) -> UnGraph<Node, Link> {
    let mut graph = UnGraph::new_undirected();
    let link = |class, bandwidth| Link { class, bandwidth };
    // Device nodes first, so that a GPU's flat index is its node index.
    for (h, host) in hosts.iter().enumerate() {
        for device in 0..host.gpus {
            graph.add_node(Node::Device { host: h, device });
        }
    }
    let domains = hosts
        .iter()
        .filter_map(|h| h.nvlink_domain)
        .max()
        .map_or(0, |m| m + 1);
    let switches: Vec<NodeIndex> = (0..domains)
        .map(|d| graph.add_node(Node::NvSwitch(d)))
        .collect();
    let racks = hosts
        .iter()
        .filter_map(|h| h.rack)
        .max()
        .map_or(0, |m| m + 1);
    let leaves: Vec<NodeIndex> = (0..racks.max(1))
        .map(|r| graph.add_node(Node::Leaf(r)))
        .collect();
    let spine = (racks > 0).then(|| graph.add_node(Node::Spine));
    let mut rack_nics = vec![0usize; leaves.len()];
    for (h, host) in hosts.iter().enumerate() {
        let root = graph.add_node(Node::Host(h));
        for device in host.first_device..host.first_device + host.gpus {
            let gpu = NodeIndex::new(device);
            graph.add_edge(gpu, root, link(LinkClass::Pcie, bw.pcie));
            if let Some(d) = host.nvlink_domain {
                graph.add_edge(gpu, switches[d], link(LinkClass::Nvlink, bw.nvlink));
            }
        }
        if host.nics > 0 && hosts.len() > 1 {
            let leaf = host.rack.unwrap_or(0);
            graph.add_edge(
                root,
                leaves[leaf],
                link(LinkClass::Nic, bw.nic * host.nics as f64),
            );
            rack_nics[leaf] += host.nics;
        }
    }
    if let Some(spine) = spine {
        for (leaf, &nics) in leaves.iter().zip(&rack_nics) {
            graph.add_edge(*leaf, spine, link(LinkClass::Spine, bw.spine * nics as f64));
        }
    }
    graph
}

/// Component labels of each device per class level, and the largest component's device count per level.
fn components(graph: &UnGraph<Node, Link>, devices: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut sets = UnionFind::<usize>::new(graph.node_count());
    let mut labels = Vec::with_capacity(LinkClass::ALL.len());
    let mut largest = Vec::with_capacity(LinkClass::ALL.len());
    for class in LinkClass::ALL {
        for edge in graph.edge_indices() {
            // Edge indices come from this graph, so both lookups succeed.
            if let (Some((a, b)), Some(link)) =
                (graph.edge_endpoints(edge), graph.edge_weight(edge))
            {
                if link.class == class {
                    sets.union(a.index(), b.index());
                }
            }
        }
        let level: Vec<usize> = (0..devices).map(|d| sets.find(d)).collect();
        let mut counts = std::collections::HashMap::new();
        for &l in &level {
            *counts.entry(l).or_insert(0usize) += 1;
        }
        largest.push(counts.values().copied().max().unwrap_or(0));
        labels.push(level);
    }
    (labels, largest)
}
