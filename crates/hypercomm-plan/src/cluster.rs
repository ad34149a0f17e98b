//! [`Cluster`]: hosts, GPUs, NVLink domains, NICs and racks, read from JSON, checked, and turned into a petgraph
//! graph whose edges carry a [`LinkClass`] and a bandwidth.
//!
//! The JSON form is [`ClusterSpec`]:
//!
//! ```json
//! {
//!   "name": "2 x HGX H100",
//!   "fabric": "InfiniBand",
//!   "bandwidth": { "nvlink": 450, "pcie": 64, "nic": 50 },
//!   "hosts": [
//!     { "name": "node0", "gpus": 8, "nics": 8, "nvlink_domain": "node0" },
//!     { "name": "node1", "gpus": 8, "nics": 8, "nvlink_domain": "node1" }
//!   ]
//! }
//! ```
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

/// The JSON description of a cluster; [`Cluster::new`] checks it. Bandwidths are in GB/s (10⁹ bytes per second),
/// one direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// A name for messages and pictures.
    #[serde(default)]
    pub name: String,
    /// What the NICs speak, for explanations (`InfiniBand`, `RoCE`); default `the network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    /// Bandwidth per link class.
    pub bandwidth: BandwidthSpec,
    /// The hosts, in launcher order: the standard launcher puts ranks `0..gpus` on the first host, and so on.
    pub hosts: Vec<HostSpec>,
    /// Where each rank runs, when not the launcher's host-major placement: entry `r` is rank `r`'s device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Vec<DeviceRef>>,
}

/// Bandwidth per link class in GB/s, one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandwidthSpec {
    /// Per GPU into its NVLink domain; required when a host names an `nvlink_domain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<f64>,
    /// Per GPU over PCIe; default 64 (PCIe 5.0 x16). Traffic leaving a host also crosses PCIe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<f64>,
    /// Per NIC; required when there is more than one host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<f64>,
    /// Per NIC between racks (lower than `nic` when the spine is oversubscribed); default `nic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spine: Option<f64>,
}

/// One host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// A unique name.
    pub name: String,
    /// The number of GPUs.
    pub gpus: usize,
    /// The number of NICs (default 1).
    #[serde(default = "one")]
    pub nics: usize,
    /// The NVLink/NVSwitch domain the host's GPUs belong to; hosts naming the same domain share it (NVL72). No
    /// domain: the GPUs meet over PCIe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// The rack (leaf switch) of the host; give every host a rack or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
}

fn one() -> usize {
    1
}

/// A device named by host and index, for explicit placements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRef {
    /// The host's name.
    pub host: String,
    /// The GPU's index on the host.
    pub device: usize,
}

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

/// A checked host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The name.
    pub name: String,
    /// The number of GPUs.
    pub gpus: usize,
    /// The number of NICs.
    pub nics: usize,
    /// The flat index of its first GPU (GPUs are numbered host by host).
    pub first_device: usize,
    /// The index of its NVLink domain, numbered by first appearance.
    pub nvlink_domain: Option<usize>,
    /// The index of its rack, numbered by first appearance.
    pub rack: Option<usize>,
}

/// Resolved bandwidths in GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidths {
    /// Per GPU into its NVLink domain (0 when no host has one).
    pub nvlink: f64,
    /// Per GPU over PCIe.
    pub pcie: f64,
    /// Per NIC (0 for a single host).
    pub nic: f64,
    /// Per NIC between racks.
    pub spine: f64,
}

/// The most GPUs a cluster may have (4Mi), so that a typo cannot make the model allocate without bound.
pub const MAX_DEVICES: usize = 1 << 22;

/// The default PCIe bandwidth, GB/s: PCIe 5.0 x16, one direction.
pub const DEFAULT_PCIE_GBS: f64 = 64.0;

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

/// Numbers `name` by first appearance in `names`.
fn intern(names: &mut Vec<String>, name: &str) -> usize {
    match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_owned());
            names.len() - 1
        }
    }
}

fn check_hosts(spec: &ClusterSpec) -> Result<Vec<Host>, TopologyError> {
    if spec.hosts.is_empty() {
        return Err(TopologyError::NoHosts);
    }
    let (mut domains, mut racks) = (Vec::new(), Vec::new());
    let mut hosts: Vec<Host> = Vec::with_capacity(spec.hosts.len());
    let mut first_device = 0usize;
    for (index, h) in spec.hosts.iter().enumerate() {
        if h.name.is_empty() {
            return Err(TopologyError::EmptyHostName { index });
        }
        if hosts.iter().any(|o| o.name == h.name) {
            return Err(TopologyError::DuplicateHost {
                name: h.name.clone(),
            });
        }
        if h.gpus == 0 {
            return Err(TopologyError::NoGpus {
                host: h.name.clone(),
            });
        }
        if h.nics == 0 && spec.hosts.len() > 1 {
            return Err(TopologyError::NoNics {
                host: h.name.clone(),
                hosts: spec.hosts.len(),
            });
        }
        if let Some(other) = spec
            .hosts
            .iter()
            .find(|o| o.rack.is_some() != h.rack.is_some())
        {
            let (without, with) = if h.rack.is_none() {
                (h, other)
            } else {
                (other, h)
            };
            return Err(TopologyError::PartialRacks {
                host: without.name.clone(),
                other: with.name.clone(),
            });
        }
        hosts.push(Host {
            name: h.name.clone(),
            gpus: h.gpus,
            nics: h.nics,
            first_device,
            nvlink_domain: h.nvlink_domain.as_deref().map(|d| intern(&mut domains, d)),
            rack: h.rack.as_deref().map(|r| intern(&mut racks, r)),
        });
        first_device = first_device
            .checked_add(h.gpus)
            .filter(|&n| n <= MAX_DEVICES)
            .ok_or_else(|| TopologyError::TooManyGpus {
                host: h.name.clone(),
                max: MAX_DEVICES,
            })?;
    }
    Ok(hosts)
}

fn check_bandwidth(spec: &ClusterSpec, hosts: &[Host]) -> Result<Bandwidths, TopologyError> {
    let b = spec.bandwidth;
    for (link, value) in [
        ("nvlink", b.nvlink),
        ("pcie", b.pcie),
        ("nic", b.nic),
        ("spine", b.spine),
    ] {
        if let Some(value) = value {
            if !(value.is_finite() && value > 0.0) {
                return Err(TopologyError::BadBandwidth { link, value });
            }
        }
    }
    let nvlink = match (b.nvlink, hosts.iter().find(|h| h.nvlink_domain.is_some())) {
        (Some(v), _) => v,
        (None, None) => 0.0,
        (None, Some(host)) => {
            return Err(TopologyError::MissingBandwidth {
                link: "nvlink",
                why: format!("host {:?} names an nvlink_domain", host.name),
            });
        }
    };
    let pcie = b.pcie.unwrap_or(DEFAULT_PCIE_GBS);
    if b.nvlink.is_some() && nvlink < pcie {
        return Err(TopologyError::NvlinkSlowerThanPcie { nvlink, pcie });
    }
    let nic = match b.nic {
        Some(v) => v,
        None if hosts.len() == 1 => 0.0,
        None => {
            return Err(TopologyError::MissingBandwidth {
                link: "nic",
                why: format!("the cluster has {} hosts", hosts.len()),
            });
        }
    };
    Ok(Bandwidths {
        nvlink,
        pcie,
        nic,
        spine: b.spine.unwrap_or(nic),
    })
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

fn check_placement(entries: &[DeviceRef], hosts: &[Host]) -> Result<Vec<usize>, TopologyError> {
    let total: usize = hosts.iter().map(|h| h.gpus).sum();
    let mut owner = vec![usize::MAX; total];
    let mut out = Vec::with_capacity(entries.len());
    for (rank, entry) in entries.iter().enumerate() {
        let host = hosts.iter().find(|h| h.name == entry.host).ok_or_else(|| {
            TopologyError::PlacementUnknownHost {
                rank,
                host: entry.host.clone(),
            }
        })?;
        if entry.device >= host.gpus {
            return Err(TopologyError::PlacementBadDevice {
                rank,
                host: entry.host.clone(),
                device: entry.device,
                gpus: host.gpus,
            });
        }
        let flat = host.first_device + entry.device;
        if owner[flat] != usize::MAX {
            return Err(TopologyError::PlacementDuplicate {
                rank,
                host: entry.host.clone(),
                device: entry.device,
                first: owner[flat],
            });
        }
        owner[flat] = rank;
        out.push(flat);
    }
    Ok(out)
}
