//! [`Placement`]: which GPU each rank of a layout runs on.
//!
//! The search considers exactly these placements, so its space is explicit:
//! - [`Placement::Launcher`]: what `torchrun` and Slurm do: local rank `r` (the layout's rank minus its offset) runs
//!   on the `r`-th GPU counting host by host in the order the cluster lists them.
//! - [`Placement::RoundRobin`]: rank `r` on host `r mod H`, device `r / H`, over the first `H = world / gpus` hosts;
//!   only for clusters whose hosts all have the same GPU count, and worlds that fill whole hosts.
//! - [`Placement::Explicit`]: the cluster description's `placement` list; when given, it is the only one searched.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;
use crate::error::TopologyError;

/// How ranks map to GPUs; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Host-major, as launchers place ranks.
    Launcher,
    /// Device-major: consecutive ranks on consecutive hosts.
    RoundRobin,
    /// The cluster description's own list.
    Explicit,
}

impl Placement {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Launcher => "launcher",
            Placement::RoundRobin => "round_robin",
            Placement::Explicit => "explicit",
        }
    }

    /// The placements the search tries on `cluster` for `world` ranks, in tie-break order: the explicit one alone
    /// when the description has one, otherwise the launcher's, then round-robin where it applies.
    pub fn candidates(cluster: &Cluster, world: usize) -> Vec<Placement> {
        if cluster.explicit_placement().is_some() {
            return vec![Placement::Explicit];
        }
        let mut out = vec![Placement::Launcher];
        // Round-robin over one host, or over hosts of one GPU, is the launcher's placement again.
        if let Ok(devices) = Placement::RoundRobin.devices(cluster, world) {
            if devices.iter().enumerate().any(|(r, &d)| r != d) {
                out.push(Placement::RoundRobin);
            }
        }
        out
    }

    /// The flat GPU index of each local rank `0..world`.
    ///
    /// ```
    /// use hypercomm_plan::{Cluster, Placement};
    ///
    /// let cluster = Cluster::from_json(r#"{"bandwidth": {"nic": 50},
    ///     "hosts": [{"name": "a", "gpus": 2}, {"name": "b", "gpus": 2}]}"#)?;
    /// assert_eq!(Placement::Launcher.devices(&cluster, 4)?, [0, 1, 2, 3]);
    /// assert_eq!(Placement::RoundRobin.devices(&cluster, 4)?, [0, 2, 1, 3]);
    /// assert!(Placement::Launcher.devices(&cluster, 5).is_err());
    /// # Ok::<(), hypercomm_plan::TopologyError>(())
    /// ```
    pub fn devices(self, cluster: &Cluster, world: usize) -> Result<Vec<usize>, TopologyError> {
        let too_small = |what: String, available| TopologyError::TooSmall {
            world,
            what,
            available,
        };
        match self {
            Placement::Launcher => {
                if world > cluster.devices() {
                    return Err(too_small(
                        format!("cluster {:?}", cluster.name()),
                        cluster.devices(),
                    ));
                }
                Ok((0..world).collect())
            }
            Placement::RoundRobin => {
                let not = |why: String| TopologyError::PlacementNotApplicable {
                    placement: self.name(),
                    why,
                };
                if !cluster.is_homogeneous() {
                    return Err(not("the hosts have different GPU counts".into()));
                }
                let gpus = cluster.hosts()[0].gpus;
                if world % gpus != 0 {
                    return Err(not(format!(
                        "world {world} does not fill whole hosts of {gpus} GPUs"
                    )));
                }
                if world > cluster.devices() {
                    return Err(too_small(
                        format!("cluster {:?}", cluster.name()),
                        cluster.devices(),
                    ));
                }
                let hosts = world / gpus;
                Ok((0..world).map(|r| (r % hosts) * gpus + r / hosts).collect())
            }
            Placement::Explicit => {
                let Some(list) = cluster.explicit_placement() else {
                    return Err(TopologyError::PlacementNotApplicable {
                        placement: self.name(),
                        why: "the cluster description has no placement list".into(),
                    });
                };
                if world > list.len() {
                    return Err(too_small("the explicit placement".into(), list.len()));
                }
                Ok(list[..world].to_vec())
            }
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
