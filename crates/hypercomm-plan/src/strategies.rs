//! Proptest strategies for clusters, for users' own property tests. Enabled by the `proptest` cargo feature.
//!
//! ```
//! use hypercomm_plan::strategies::arb_cluster;
//! use proptest::prelude::*;
//!
//! proptest!(|(cluster in arb_cluster(4))| {
//!     prop_assert!((1..=4).contains(&cluster.hosts().len()));
//!     prop_assert!(cluster.is_homogeneous());
//! });
//! ```

use proptest::prelude::*;

use crate::cluster::Cluster;
use crate::spec::{BandwidthSpec, ClusterSpec, HostSpec};

/// Clusters of 1 to `max_hosts` hosts (at least 1) with the same GPU count each (1, 2, 4 or 8), each host its own
/// NVLink domain, none, or domains of two hosts (NVL-like), optionally in racks, with bandwidths strictly slower
/// outwards: `nvlink > pcie > nic`, and `spine <= nic`. Hosts are named `h0, h1, ...`.
pub fn arb_cluster(max_hosts: usize) -> impl Strategy<Value = Cluster> {
    (
        1..=max_hosts.max(1),
        proptest::sample::select(vec![1usize, 2, 4, 8]),
        0..3usize,
        0..4usize,
        any::<proptest::sample::Index>(),
        (10.0..100.0f64, 1.5..3.0f64, 2.0..10.0f64, 0.25..=1.0f64),
    )
        .prop_map(
            |(hosts, gpus, domains, racks, nics, (nic, pcie, nvlink, spine))| {
                let pcie = nic * pcie;
                let spec = ClusterSpec {
                    name: "arb".into(),
                    fabric: None,
                    bandwidth: BandwidthSpec {
                        nvlink: Some(pcie * nvlink),
                        pcie: Some(pcie),
                        nic: Some(nic),
                        spine: Some(nic * spine),
                    },
                    hosts: (0..hosts)
                        .map(|h| HostSpec {
                            name: format!("h{h}"),
                            gpus,
                            nics: 1 + nics.index(gpus),
                            nvlink_domain: match domains {
                                0 => None,
                                1 => Some(format!("d{h}")),
                                _ => Some(format!("d{}", h / 2)),
                            },
                            // racks 0: none; otherwise `racks` hosts per rack.
                            rack: (racks > 0).then(|| format!("r{}", h / racks)),
                        })
                        .collect(),
                    placement: None,
                };
                // Names are distinct and non-empty, GPU and NIC counts positive, bandwidths positive with nvlink above
                // pcie, and racks given for all hosts or none: construction cannot fail.
                Cluster::new(spec).expect("generated cluster is valid")
            },
        )
}
