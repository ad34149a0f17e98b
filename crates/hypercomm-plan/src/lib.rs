//! Topology-aware planning: placing a layout's process groups onto a cluster, what that placement's communication
//! costs, and a search for the dimension order (and rank placement) that costs least. Built on `hypercomm-grid`,
//! which says which ranks form which groups; this crate says which GPUs, links and NICs those groups use. Pure: no
//! I/O.
//!
//! 1. Describe the cluster in JSON and check it with [`Cluster::from_json`]: hosts, GPUs, NVLink domains (which
//!    may span hosts, as in NVL72 racks), NICs, racks and bandwidths become a petgraph graph whose edges carry a
//!    [`LinkClass`] and a bandwidth.
//! 2. Say how many bytes each kind of parallelism moves per step: [`Traffic`] by hand, or
//!    [`Traffic::from_model`] from a [`ModelShape`].
//! 3. [`score`] one layout, or [`search`] every order and [`Placement`] for a [`Ranking`]; [`explain`] a score in
//!    words and state the [`verdict`] against Megatron's default order.
//!
//! `strategies` (cargo feature `proptest`) has a proptest strategy for clusters, for your own property tests.
//!
//! ```
//! use hypercomm_grid::layout::LayoutConfig;
//! use hypercomm_plan::{search, Cluster, LinkClass, ModelShape, Traffic};
//!
//! let hosts: Vec<String> = (0..8)
//!     .map(|h| format!(r#"{{"name": "node{h}", "gpus": 8, "nics": 8, "nvlink_domain": "node{h}"}}"#))
//!     .collect();
//! let cluster = Cluster::from_json(&format!(
//!     r#"{{"fabric": "InfiniBand", "bandwidth": {{"nvlink": 450, "nic": 50}}, "hosts": [{}]}}"#,
//!     hosts.join(",")
//! ))?;
//! let config = LayoutConfig::new(64).tp(8).pp(2);
//! let traffic = Traffic::from_model(&ModelShape::default(), &config.clone().build()?)?;
//! let ranking = search(&cluster, &config, &traffic)?;
//! let best = ranking.best();
//! assert_eq!(best.order, "tp-dp-pp");
//! assert_eq!(best.kinds[0].worst, LinkClass::Nvlink); // tp stays inside each host
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cluster;
mod error;
mod explain;
mod link;
mod placement;
mod score;
mod search;
mod spec;
mod traffic;

#[cfg(any(test, feature = "proptest"))]
pub mod strategies;
#[cfg(test)]
mod tests;

pub use cluster::{Cluster, Link, Node};
pub use error::TopologyError;
pub use explain::{explain, number, seconds, verdict};
pub use link::LinkClass;
pub use placement::Placement;
pub use score::{KindCost, Score, score};
pub use search::{Ranking, candidate_orders, search};
pub use spec::{
    BandwidthSpec, Bandwidths, ClusterSpec, DEFAULT_PCIE_GBS, DeviceRef, Host, HostSpec,
    MAX_DEVICES,
};
pub use traffic::{Collective, ModelShape, Traffic, TrafficKind};
