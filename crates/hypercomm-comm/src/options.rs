//! [`CommOptions`]: how a communicator is set up, including the NCCL knobs other backends must honour or reject.

use std::sync::Arc;
use std::time::Duration;

use crate::{CommError, FailureDomain, NcclOptions, StepHook};

/// Which host algorithm family runs a collective. `Auto` picks by message size and rank count; the others force a
/// path (for tests at the threshold and for benchmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Choose by size (see the host backend's module docs for the thresholds).
    #[default]
    Auto,
    /// Every rank publishes its whole input and reads everyone else's: fewest synchronisations.
    Latency,
    /// Chunked, pipelined reduce-scatter plus all-gather: least data moved per rank.
    Bandwidth,
    /// All-reduce, all-gather and reduce-scatter read the peers' buffers where they are, one copy by the kernel
    /// (cross-memory attach, `process_vm_readv`), where the ranks share a host and may read each other's memory;
    /// otherwise, and for the other collectives, as `Bandwidth`. `Auto` takes it for all-reduces of 2 to 32 MiB,
    /// all-gathers of 512 KiB to 16 MiB of output and reduce-scatters of 2 to 16 MiB of input. The kernel's copy
    /// pays per 4 KiB page, so on buffers backed by 2 MiB pages
    /// ([`huge_page_vec`](crate::host_buffer::huge_page_vec)) it wins at larger sizes too, which `Auto` cannot
    /// tell.
    Direct,
}

/// Options for a communicator.
///
/// The NCCL knobs (`nccl`, an [`NcclOptions`]) are unset by default. A backend honours each
/// one that is set or fails construction with [`CommError::UnsupportedOption`] naming it: no option is dropped
/// silently. The host backend honours none of them.
///
/// ```
/// use std::time::Duration;
/// use hypercomm_comm::CommOptions;
///
/// let opts = CommOptions { timeout: Duration::from_secs(30), ..CommOptions::named("tp") };
/// assert_eq!(opts.name, "tp");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CommOptions {
    /// The communicator's name: its namespace in the store and in every error. Use each name once per store.
    pub name: String,
    /// How long any single wait (bootstrap, a collective, a send) may take before the peers are declared missing.
    pub timeout: Duration,
    /// Host backend: use TCP even between ranks on the same machine.
    pub force_tcp: bool,
    /// Host backend, across machines: the address peers on other hosts reach this rank at. Unset: the first
    /// non-loopback address this host's name resolves to. Ranks that share a host always meet over loopback.
    pub host_addr: Option<std::net::IpAddr>,
    /// Host backend: force an algorithm family instead of choosing by size.
    pub algorithm: Algorithm,
    /// Host backend: bytes of staging area per rank and round (default 1 MiB); large messages are pipelined
    /// through it in pieces.
    pub scratch_bytes: Option<usize>,
    /// Host backend: bytes of each rank's symmetric window (default 0: none), from which
    /// [`Communicator::symmetric_buffer`](crate::Communicator::symmetric_buffer) allocates buffers that every rank
    /// on the host can read in place (see [`symmetric`](crate::symmetric)). Rounded up to a 4 KiB page. Memory is
    /// taken only as pages are touched.
    pub symmetric_bytes: usize,
    /// NCCL's knobs: honoured by the NCCL backend, refused by the host backend when set.
    pub nccl: NcclOptions,
    /// Where the communicator records failures and which communicators fail with it (see [`FailureDomain`]).
    /// Host backend unset: a domain of its own, keyed under `comm/<name>/failure` in its store; NCCL backend
    /// unset: no domain. A `ProcessGroupCollection` sets one domain for all its communicators, host and NCCL.
    pub failure_domain: Option<Arc<FailureDomain>>,
    /// Host backend: a function called at every named [`Step`](crate::Step) of the bootstrap (fault injection;
    /// see [`StepHook`]). Unset by default. Other backends do not call it.
    pub on_step: Option<StepHook>,
    /// NCCL flavor: how many of its last device operations the communicator's flight recorder keeps (default
    /// [`DEFAULT_FLIGHT_RECORDER_LEN`](crate::device::DEFAULT_FLIGHT_RECORDER_LEN); 0 keeps only the last started
    /// and completed). A communicator without a GPU has no device operations to record.
    pub flight_recorder_len: usize,
    /// NCCL flavor: the folder the flight record goes to as JSON when the communicator breaks
    /// (`<communicator name>.rank<member id>.json`). Unset: the environment variable
    /// [`FLIGHT_RECORDER_DIR_ENV`](crate::device::FLIGHT_RECORDER_DIR_ENV) as the device runtime's
    /// `probe_with_env` read it, else nowhere.
    pub flight_recorder_dir: Option<std::path::PathBuf>,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions::named("world")
    }
}

impl CommOptions {
    /// Default options with the given name: 5-minute timeout, automatic transport and algorithm, no NCCL knobs.
    pub fn named(name: impl Into<String>) -> Self {
        CommOptions {
            name: name.into(),
            timeout: Duration::from_secs(300),
            force_tcp: false,
            host_addr: None,
            algorithm: Algorithm::Auto,
            scratch_bytes: None,
            symmetric_bytes: 0,
            nccl: NcclOptions::default(),
            failure_domain: None,
            on_step: None,
            flight_recorder_len: crate::device::DEFAULT_FLIGHT_RECORDER_LEN,
            flight_recorder_dir: None,
        }
    }

    /// The names of the NCCL-only knobs that are set, in field order.
    pub fn nccl_knobs_set(&self) -> Vec<&'static str> {
        self.nccl.set()
    }

    /// These options with every NCCL knob unset: what the host flavor of a communicator with a GPU gets.
    #[must_use]
    pub fn without_nccl_knobs(&self) -> CommOptions {
        CommOptions {
            nccl: NcclOptions::default(),
            ..self.clone()
        }
    }

    /// These options for the NCCL flavor of a communicator with a GPU: named `<name>/device`, with the host-only knobs
    /// (`force_tcp`, `algorithm`, `scratch_bytes`, `symmetric_bytes`) unset.
    ///
    /// ```
    /// use hypercomm_comm::CommOptions;
    ///
    /// let mut opts = CommOptions { force_tcp: true, ..CommOptions::named("tp") };
    /// opts.nccl.max_ctas = Some(8);
    /// let device = opts.for_device();
    /// assert_eq!((device.name.as_str(), device.force_tcp, device.nccl.max_ctas), ("tp/device", false, Some(8)));
    /// ```
    #[must_use]
    pub fn for_device(&self) -> CommOptions {
        CommOptions {
            name: format!("{}/device", self.name),
            force_tcp: false,
            algorithm: Algorithm::Auto,
            scratch_bytes: None,
            symmetric_bytes: 0,
            ..self.clone()
        }
    }

    /// Checks the options against what the host flavor implements: it honours no NCCL knob (a communicator
    /// with a GPU hands them to its NCCL flavor; see [`for_device`](Self::for_device)).
    pub(crate) fn validate_host(&self) -> Result<(), CommError> {
        if let Some(option) = self.nccl_knobs_set().first() {
            return Err(CommError::UnsupportedOption {
                backend: "host",
                option,
            });
        }
        if self.scratch_bytes.is_some_and(|b| b < 64) {
            return Err(CommError::InvalidArgument {
                comm: self.name.clone(),
                what: format!(
                    "scratch_bytes={:?} is below the minimum of 64",
                    self.scratch_bytes
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nccl_knobs_clears_every_knob_and_keeps_the_rest() {
        let all = CommOptions {
            force_tcp: true,
            nccl: NcclOptions {
                high_priority_stream: Some(true),
                cga_cluster_size: Some(2),
                min_ctas: Some(1),
                max_ctas: Some(8),
                net_name: Some("IB".into()),
                blocking: Some(false),
                split_share: Some(true),
                traffic_class: Some(3),
            },
            ..CommOptions::named("k")
        };
        assert_eq!(all.nccl_knobs_set().len(), 8);
        let host = all.without_nccl_knobs();
        assert!(host.nccl_knobs_set().is_empty());
        assert!(host.validate_host().is_ok());
        assert_eq!((host.name.as_str(), host.force_tcp), ("k", true));
    }

    #[test]
    fn host_rejects_every_nccl_knob_by_name() {
        let cases: Vec<(&str, CommOptions)> = vec![
            (
                "high_priority_stream",
                CommOptions {
                    nccl: NcclOptions {
                        high_priority_stream: Some(true),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "cga_cluster_size",
                CommOptions {
                    nccl: NcclOptions {
                        cga_cluster_size: Some(2),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "min_ctas",
                CommOptions {
                    nccl: NcclOptions {
                        min_ctas: Some(1),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "max_ctas",
                CommOptions {
                    nccl: NcclOptions {
                        max_ctas: Some(8),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "net_name",
                CommOptions {
                    nccl: NcclOptions {
                        net_name: Some("IB".into()),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "blocking",
                CommOptions {
                    nccl: NcclOptions {
                        blocking: Some(false),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "split_share",
                CommOptions {
                    nccl: NcclOptions {
                        split_share: Some(true),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
            (
                "traffic_class",
                CommOptions {
                    nccl: NcclOptions {
                        traffic_class: Some(3),
                        ..NcclOptions::default()
                    },
                    ..Default::default()
                },
            ),
        ];
        for (name, opts) in cases {
            match opts.validate_host() {
                Err(CommError::UnsupportedOption {
                    backend: "host",
                    option,
                }) => assert_eq!(option, name),
                other => panic!("{name}: expected rejection, got {other:?}"),
            }
        }
        assert!(CommOptions::default().validate_host().is_ok());
    }
}
