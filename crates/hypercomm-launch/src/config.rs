//! [`Launcher`]'s data: what to run and how. Its own room, below both the builder (`launcher`: the setters and
//! `run`) and the job (`job`) that reads it while it starts and supervises the ranks.

use std::ffi::OsString;
use std::time::Duration;

use hypercomm_store::Secret;

/// The communicator timeout a launcher assumes unless told otherwise: the default of hypercomm's communicators
/// (`CommOptions::named`, `CollectionBuilder`), 300 s.
pub const DEFAULT_COMM_TIMEOUT: Duration = Duration::from_secs(300);

/// What the default grace period adds to the communicator timeout: the time a rank needs, once its wait has timed
/// out, to read its peers' failure records (up to about 3 s), print its error and exit, on a loaded machine.
pub const REPORT_MARGIN: Duration = Duration::from_secs(15);

/// How long a rank has between SIGTERM and SIGKILL unless told otherwise.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// What to run and how. Build with [`Launcher::new`] and the setters, then [`Launcher::run`].
///
/// The job (`crate::job`) reads the fields while it starts and supervises the ranks.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    pub(crate) nproc: usize,
    pub(crate) nnodes: usize,
    pub(crate) node_rank: usize,
    pub(crate) master_addr: String,
    pub(crate) master_port: u16,
    /// Failure to SIGTERM; `None`: derived from `comm_timeout` ([`Launcher::grace_period`]).
    pub(crate) grace: Option<Duration>,
    /// SIGTERM to SIGKILL.
    pub(crate) kill_after: Duration,
    /// The ranks' communicator timeout, as far as the launcher knows it; told to the ranks.
    pub(crate) comm_timeout: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) forward_signals: bool,
    pub(crate) echo: bool,
    pub(crate) capture: bool,
    pub(crate) secret: Option<Secret>,
    pub(crate) relay: Option<bool>,
    pub(crate) torchrun_env: bool,
    /// Bind each local rank to its own share of the CPUs ([`Launcher::bind_cpus`]).
    pub(crate) bind_cpus: bool,
    pub(crate) env: Vec<(OsString, OsString)>,
}

/// The CPUs of `allowed` cut, in order, into `nproc` contiguous shares whose sizes differ by at most one (the
/// first `allowed.len() % nproc` shares get the extra CPU); `None` when there are fewer CPUs than shares.
pub(crate) fn cpu_shares(allowed: &[usize], nproc: usize) -> Option<Vec<Vec<usize>>> {
    if nproc == 0 || allowed.len() < nproc {
        return None;
    }
    let (base, extra) = (allowed.len() / nproc, allowed.len() % nproc);
    let mut rest = allowed;
    Some(
        (0..nproc)
            .map(|i| {
                let (share, tail) = rest.split_at(base + usize::from(i < extra));
                rest = tail;
                share.to_vec()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::cpu_shares;

    #[test]
    fn shares_cover_every_cpu_once_in_order_and_differ_by_at_most_one() {
        for cpus in 1..=12usize {
            // Allowed CPUs need not be contiguous: every third one here.
            let allowed: Vec<usize> = (0..cpus).map(|c| 3 * c + 1).collect();
            for nproc in 1..=cpus {
                let shares = cpu_shares(&allowed, nproc).expect("enough CPUs");
                assert_eq!(shares.len(), nproc);
                assert_eq!(shares.concat(), allowed, "{cpus} CPUs, {nproc} ranks");
                let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(*lo >= 1 && hi - lo <= 1, "{sizes:?}");
                assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
            }
            assert_eq!(cpu_shares(&allowed, cpus + 1), None);
        }
        assert_eq!(cpu_shares(&[0, 1], 0), None);
    }
}
