//! [`TopologyError`]: why a cluster description is invalid, or why a layout cannot be placed or scored on it.

use hypercomm_grid::layout::LayoutError;

/// Why a cluster could not be built, or a layout could not be placed or scored on it. Each variant names the bad
/// entry and the rule it broke.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The cluster lists no hosts.
    #[error("the cluster lists no hosts")]
    NoHosts,
    /// A host entry without a name.
    #[error("host #{index} has an empty name")]
    EmptyHostName {
        /// The host's position in `hosts`.
        index: usize,
    },
    /// Two host entries with one name.
    #[error("host {name:?} is listed more than once")]
    DuplicateHost {
        /// The repeated name.
        name: String,
    },
    /// JSON that does not parse or has the wrong shape.
    #[error("cluster description: {why}")]
    BadJson {
        /// serde_json's message, with line and column.
        why: String,
    },
    /// More GPUs in all than [`MAX_DEVICES`](crate::MAX_DEVICES).
    #[error("host {host:?} takes the cluster past {max} GPUs")]
    TooManyGpus {
        /// The host at which the count passes the limit.
        host: String,
        /// The limit.
        max: usize,
    },
    /// A host without GPUs.
    #[error("host {host:?} has gpus=0: every host needs at least one GPU")]
    NoGpus {
        /// The host's name.
        host: String,
    },
    /// A host without a NIC in a cluster of several hosts.
    #[error("host {host:?} has nics=0: in a cluster of {hosts} hosts every host needs a NIC")]
    NoNics {
        /// The host's name.
        host: String,
        /// The number of hosts.
        hosts: usize,
    },
    /// A bandwidth that is zero, negative or not a number.
    #[error("bandwidth.{link}={value} must be a positive number of GB/s")]
    BadBandwidth {
        /// The link class's field name.
        link: &'static str,
        /// The value given.
        value: f64,
    },
    /// A bandwidth that the cluster needs but does not give.
    #[error("bandwidth.{link} is not given, but {why}")]
    MissingBandwidth {
        /// The link class's field name.
        link: &'static str,
        /// Why it is needed.
        why: String,
    },
    /// NVLink given as slower than PCIe: link classes must get slower from NVLink outwards.
    #[error(
        "bandwidth.nvlink={nvlink} is below bandwidth.pcie={pcie}: NVLink must be the faster link"
    )]
    NvlinkSlowerThanPcie {
        /// The NVLink bandwidth.
        nvlink: f64,
        /// The PCIe bandwidth.
        pcie: f64,
    },
    /// Some hosts name a rack and others do not.
    #[error(
        "host {host:?} names no rack while host {other:?} does: give every host a rack or none"
    )]
    PartialRacks {
        /// A host without a rack.
        host: String,
        /// A host with one.
        other: String,
    },
    /// A host that no link reaches (cannot happen with the links this model builds; kept as a guard).
    #[error("host {host:?} cannot reach host {other:?} over any link")]
    Unreachable {
        /// The unreachable host.
        host: String,
        /// The host it cannot reach.
        other: String,
    },
    /// An explicit placement entry naming a host that does not exist.
    #[error("placement[{rank}] names host {host:?}, which the cluster does not list")]
    PlacementUnknownHost {
        /// The rank whose entry is bad.
        rank: usize,
        /// The host named.
        host: String,
    },
    /// An explicit placement entry naming a device past the host's GPUs.
    #[error("placement[{rank}] names device {device} of host {host:?}, which has {gpus} GPUs")]
    PlacementBadDevice {
        /// The rank whose entry is bad.
        rank: usize,
        /// The host named.
        host: String,
        /// The device index given.
        device: usize,
        /// The host's GPU count.
        gpus: usize,
    },
    /// Two ranks placed on one device.
    #[error(
        "placement[{rank}] puts a second rank on device {device} of host {host:?} (first: rank {first})"
    )]
    PlacementDuplicate {
        /// The second rank.
        rank: usize,
        /// The host.
        host: String,
        /// The device.
        device: usize,
        /// The rank placed there first.
        first: usize,
    },
    /// More ranks than the cluster has devices, or than an explicit placement covers.
    #[error("world {world} needs {world} devices but {what} has {available}")]
    TooSmall {
        /// The layout's world size.
        world: usize,
        /// What is too small (`cluster "name"` or `the explicit placement`).
        what: String,
        /// How many devices (or entries) it has.
        available: usize,
    },
    /// A placement that does not apply to this cluster and world.
    #[error("placement {placement} does not apply: {why}")]
    PlacementNotApplicable {
        /// The placement's name.
        placement: &'static str,
        /// Why not.
        why: String,
    },
    /// A traffic override that cannot be parsed or names an unknown dimension.
    #[error("traffic {text:?}: {why}")]
    BadTraffic {
        /// The text given.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A model-shape value that is zero, negative or not a number.
    #[error("model {field}={value} must be a positive number")]
    BadModel {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// The layout itself is invalid.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}
