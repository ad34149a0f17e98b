//! [`ClusterSpec`]: the JSON description of a cluster, and its checks, which turn it into [`Host`]s and
//! [`Bandwidths`] for [`Cluster::new`](crate::Cluster::new) to build the graph from.
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

use serde::{Deserialize, Serialize};

use crate::error::TopologyError;

/// The JSON description of a cluster; [`Cluster::new`](crate::Cluster::new) checks it. Bandwidths are in GB/s
/// (10⁹ bytes per second), one direction.
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

/// Checks the hosts of `spec` and numbers their GPUs, NVLink domains and racks.
pub(crate) fn check_hosts(spec: &ClusterSpec) -> Result<Vec<Host>, TopologyError> {
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

/// Checks the bandwidths of `spec` and fills in the defaults.
pub(crate) fn check_bandwidth(
    spec: &ClusterSpec,
    hosts: &[Host],
) -> Result<Bandwidths, TopologyError> {
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

/// Checks an explicit placement: each entry a GPU of a listed host, none twice. Flat device indices per rank.
pub(crate) fn check_placement(
    entries: &[DeviceRef],
    hosts: &[Host],
) -> Result<Vec<usize>, TopologyError> {
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
