//! [`CommError`]: everything a communicator can report, each variant naming the communicator and the culprit.

use std::time::Duration;

use hypercomm_store::StoreError;

/// What went wrong in a communicator. Every variant names the communicator; failures caused by other ranks name
/// those ranks.
///
/// Ranks in errors ([`Timeout::missing`](CommError::Timeout), [`PeerDied::ranks`](CommError::PeerDied),
/// [`AbortedByPeer::by`/`lost`](CommError::AbortedByPeer), [`Mismatch::culprits`](CommError::Mismatch), the
/// `members` lists and [`RootCause::ranks`]) are **member ids**: the ids the communicator was created with
/// (`Communicator::new`'s `ranks`), not positions within it. A communicator of a
/// `ProcessGroupCollection` is created with world ranks, so its errors name world ranks, ready for
/// `ShrunkLayout::without_replicas_of(&layout, err.lost_ranks())`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// An option was set that the chosen backend does not implement. Options are never dropped silently.
    #[error(
        "backend {backend} does not support option {option}; leave it unset (an nccl knob needs a communicator with a gpu)"
    )]
    UnsupportedOption {
        /// The backend that rejected it.
        backend: &'static str,
        /// The option's field name in `CommOptions`.
        option: &'static str,
    },
    /// A set option needs a newer release of the backend's library than the one loaded; it is refused rather
    /// than dropped (NCCL silently ignores config fields newer than itself).
    #[error(
        "option {option} needs {library} {needs} or newer, but {library} {loaded} is loaded; leave it unset or upgrade"
    )]
    OptionNeedsNewerLibrary {
        /// The option's field name in `CommOptions`.
        option: &'static str,
        /// The library (`"nccl"`).
        library: &'static str,
        /// The first release that honours the option.
        needs: String,
        /// The loaded release.
        loaded: String,
    },
    /// Something this operation needs is not on this machine (no GPU, no CUDA driver, no NCCL, no NVRTC). Nothing
    /// was started; the error says what is missing and why, and nothing panics on the way.
    #[error("{what} is unavailable: {why}")]
    Unavailable {
        /// What was asked for (`"cuda driver"`, `"nccl"`, `"device communicator"`).
        what: String,
        /// Why it cannot be had, with what was tried.
        why: String,
    },
    /// A caller-side argument is wrong (buffer length, root, peer, rank list). Nothing was sent.
    #[error("communicator {comm}: {what}")]
    InvalidArgument {
        /// The communicator's name.
        comm: String,
        /// What is wrong, with the offending value.
        what: String,
    },
    /// The ranks called the same collective with different arguments, or different collectives. Every rank gets
    /// this error for the same operation; no data moved and the communicator stays usable.
    #[error(
        "communicator {comm}{}: ranks disagree: {}",
        members_suffix(members),
        describe_calls(calls, culprits)
    )]
    Mismatch {
        /// The communicator's name.
        comm: String,
        /// The communicator's member ids (see [`CommError`]), in member order.
        members: Vec<usize>,
        /// The ranks to blame (member ids): those whose call differs from the majority's. When the sides tie (as
        /// they always do in a two-member communicator) the side of the lowest-positioned member is taken as the
        /// reference, so the others are blamed.
        culprits: Vec<usize>,
        /// Every distinct call and the ranks (member ids) that made it, the reference call last.
        calls: Vec<Call>,
    },
    /// Some ranks did not reach an operation within the timeout. The communicator is now broken.
    #[error(
        "communicator {comm}{}: {} within {after:?} (in {during}){}",
        members_suffix(members),
        who_missed(missing),
        cause_suffix(cause.as_deref())
    )]
    Timeout {
        /// The communicator's name.
        comm: String,
        /// The communicator's member ids (see [`CommError`]); empty where the backend does not know them.
        members: Vec<usize>,
        /// The ranks (member ids) that were waited for; empty when no rank was missing (the operation did not
        /// finish in time all the same: the ranks disagreed, or waited on each other, as `cause` says).
        missing: Vec<usize>,
        /// The timeout.
        after: Duration,
        /// The operation that was waiting.
        during: String,
        /// When a missing rank was itself alive and stuck on another failure (it left a failure record), that
        /// failure: the ranks really at fault. [`CommError::lost_ranks`] prefers it to `missing`.
        cause: Option<Box<RootCause>>,
    },
    /// Some ranks' processes exited or closed their connections. The communicator is now broken.
    #[error(
        "communicator {comm}{}: rank(s) {ranks:?} died (in {during})",
        members_suffix(members)
    )]
    PeerDied {
        /// The communicator's name.
        comm: String,
        /// The communicator's member ids (see [`CommError`]).
        members: Vec<usize>,
        /// The ranks (member ids) that are gone.
        ranks: Vec<usize>,
        /// The operation that noticed.
        during: String,
    },
    /// Another rank aborted the communicator or gave up after a failure of its own (it may have exited since);
    /// this rank stops too.
    #[error(
        "communicator {comm}{}: aborted by rank {by} (in {during}){}",
        members_suffix(members),
        aborted_suffix(lost, cause.as_deref())
    )]
    AbortedByPeer {
        /// The communicator's name.
        comm: String,
        /// The communicator's member ids (see [`CommError`]).
        members: Vec<usize>,
        /// The rank (member id) that aborted: the messenger, not necessarily the culprit.
        by: usize,
        /// The operation that noticed.
        during: String,
        /// The ranks (member ids) that were lost (dead or missing) at the root of the failure, as the aborting
        /// rank recorded them; empty for a deliberate abort, for a disagreement, or when no record arrived in time.
        lost: Vec<usize>,
        /// The root cause the aborting rank recorded, when one arrived in time.
        cause: Option<Box<RootCause>>,
    },
    /// The communicator failed earlier or was aborted; no operation runs on it any more.
    #[error("communicator {comm} is broken: {cause}")]
    Broken {
        /// The communicator's name.
        comm: String,
        /// The first failure, as text.
        cause: String,
        /// The root cause settled in the communicator's failure domain, when one was: whom
        /// [`lost_ranks`](CommError::lost_ranks) and [`culprits`](CommError::culprits) blame. A failure that the
        /// GPU's watchdog met first reaches the user only this way.
        root: Option<Box<RootCause>>,
    },
    /// Rendezvous through the store failed.
    #[error("communicator {comm}: store: {source}")]
    Store {
        /// The communicator's name.
        comm: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// An operating-system call failed (shared memory, sockets).
    #[error("communicator {comm}: {what}: {source}")]
    Io {
        /// The communicator's name.
        comm: String,
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CUDA or NCCL call failed on the device backend. The communicator is now broken.
    #[error("communicator {comm}: {what}")]
    Device {
        /// The communicator's name (or the device, before a communicator exists).
        comm: String,
        /// The call that failed and the library's own error text.
        what: String,
    },
    /// A peer sent something that is not part of the protocol (a bug or a foreign process).
    #[error("communicator {comm}: protocol violation: {what}")]
    Protocol {
        /// The communicator's name.
        comm: String,
        /// What was wrong.
        what: String,
    },
}

fn members_suffix(members: &[usize]) -> String {
    if members.is_empty() {
        String::new()
    } else {
        format!(" (members {members:?})")
    }
}

fn who_missed(missing: &[usize]) -> String {
    if missing.is_empty() {
        "the operation did not finish".to_owned()
    } else {
        format!("rank(s) {missing:?} did not respond")
    }
}

fn cause_suffix(cause: Option<&RootCause>) -> String {
    cause.map_or_else(String::new, |c| format!("; root cause: {c}"))
}

fn aborted_suffix(lost: &[usize], cause: Option<&RootCause>) -> String {
    match cause {
        Some(c) => format!("; root cause: {c}"),
        None if lost.is_empty() => String::new(),
        None => format!(" after losing rank(s) {lost:?}"),
    }
}

fn describe_calls(calls: &[Call], culprits: &[usize]) -> String {
    let Some((reference, others)) = calls.split_last() else {
        return format!("rank(s) {culprits:?}");
    };
    let others: Vec<String> = others
        .iter()
        .map(|c| format!("rank(s) {:?} called {}", c.ranks, c.call))
        .collect();
    format!(
        "{} but rank(s) {:?} called {}",
        others.join(", "),
        reference.ranks,
        reference.call
    )
}

/// One side of a disagreement: a call, and the ranks that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The ranks (member ids) that made this call, ascending.
    pub ranks: Vec<usize>,
    /// The call as the ranks described it, like `all_reduce(#3, dtype=f32, count=4, op=sum)`.
    pub call: String,
}

/// How the ranks of a [`RootCause`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Their processes exited or their connections closed.
    Died,
    /// They were alive (or stopped) but did not take part within the timeout.
    Missing,
    /// They called an operation with arguments that disagree with the others'.
    Disagreed,
    /// They waited on each other in a cycle, each for the next (every stage of a ring sending before it
    /// receives, as separate operations that NCCL runs in issue order), so none could go on.
    Deadlocked,
}

impl Fault {
    /// The fault as a word (`"died"`, `"missing"`, `"disagreed"`, `"deadlocked"`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::Died => "died",
            Fault::Missing => "missing",
            Fault::Disagreed => "disagreed",
            Fault::Deadlocked => "deadlocked",
        }
    }

    /// The fault named by [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Fault> {
        [
            Fault::Died,
            Fault::Missing,
            Fault::Disagreed,
            Fault::Deadlocked,
        ]
        .into_iter()
        .find(|f| f.name() == name)
    }

    /// Whether the ranks at fault are lost to the job (dead, or gone silent), rather than alive and at odds with
    /// the others (a disagreement, a cycle of waits).
    pub fn loses_ranks(self) -> bool {
        matches!(self, Fault::Died | Fault::Missing)
    }
}

/// The first failure behind an error, as the rank that saw it recorded it for the others: which ranks failed, how,
/// and where. A rank stopped by the news of that failure (a peer's abort, a peer that vanished after giving up, a
/// peer that was stuck on it) reports it instead of blaming the messenger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootCause {
    /// The ranks at fault (member ids; world ranks in a collection); empty when the failure did not say (an NCCL
    /// communicator that failed or timed out).
    pub ranks: Vec<usize>,
    /// How they failed.
    pub fault: Fault,
    /// The communicator in which it was seen.
    pub comm: String,
    /// The rank (member id) that saw it.
    pub seen_by: usize,
    /// What was going on: the operation, or what the disagreeing ranks called.
    pub detail: String,
}

impl std::fmt::Display for RootCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.fault {
            Fault::Died => "died",
            Fault::Missing => "did not respond",
            Fault::Disagreed => "disagreed",
            Fault::Deadlocked => "waited on each other in a cycle",
        };
        // An NCCL failure does not say which rank was lost.
        let who = if self.ranks.is_empty() {
            "an unknown rank".to_owned()
        } else {
            format!("rank(s) {:?}", self.ranks)
        };
        write!(
            f,
            "{who} {what} (seen by rank {} in communicator {}: {})",
            self.seen_by, self.comm, self.detail
        )
    }
}

impl CommError {
    /// Communicator `comm` is broken by `cause` (text), with the root cause settled in its failure domain, if any.
    pub(crate) fn broken(
        comm: &str,
        cause: impl Into<String>,
        root: Option<RootCause>,
    ) -> CommError {
        CommError::Broken {
            comm: comm.to_owned(),
            cause: cause.into(),
            root: root.map(Box::new),
        }
    }

    /// A timeout in a backend, with ranks as positions within the communicator (the communicator turns them into
    /// member ids and fills in the members).
    pub(crate) fn timeout(
        comm: &str,
        missing: Vec<usize>,
        after: Duration,
        during: impl Into<String>,
    ) -> CommError {
        CommError::Timeout {
            comm: comm.to_owned(),
            members: Vec::new(),
            missing,
            after,
            during: during.into(),
            cause: None,
        }
    }

    /// Dead peers seen by a backend, as positions (see [`timeout`](Self::timeout)).
    pub(crate) fn peer_died(comm: &str, ranks: Vec<usize>, during: impl Into<String>) -> CommError {
        CommError::PeerDied {
            comm: comm.to_owned(),
            members: Vec::new(),
            ranks,
            during: during.into(),
        }
    }

    /// A peer's abort seen by a backend, as a position (see [`timeout`](Self::timeout)).
    pub(crate) fn aborted_by(comm: &str, by: usize, during: impl Into<String>) -> CommError {
        CommError::AbortedByPeer {
            comm: comm.to_owned(),
            members: Vec::new(),
            by,
            during: during.into(),
            lost: Vec::new(),
            cause: None,
        }
    }

    /// A disagreement between the sides `calls` (ranks as positions, or already member ids with `members`
    /// set): the culprits are the ranks outside the largest side; on a tie, outside the side of the
    /// lowest-positioned member. The reference side goes last.
    pub(crate) fn mismatch(comm: &str, members: Vec<usize>, mut calls: Vec<Call>) -> CommError {
        for c in &mut calls {
            c.ranks.sort_unstable();
        }
        let position = |r: usize| members.iter().position(|&m| m == r).unwrap_or(r);
        let lowest = |c: &Call| {
            c.ranks
                .iter()
                .map(|&r| position(r))
                .min()
                .unwrap_or(usize::MAX)
        };
        // Largest side first; among equals, the one holding the lowest position.
        calls.sort_by(|a, b| {
            b.ranks
                .len()
                .cmp(&a.ranks.len())
                .then(lowest(a).cmp(&lowest(b)))
        });
        if !calls.is_empty() {
            let reference = calls.remove(0);
            calls.push(reference);
        }
        let mut culprits: Vec<usize> = calls
            .iter()
            .rev()
            .skip(1)
            .flat_map(|c| c.ranks.iter().copied())
            .collect();
        culprits.sort_unstable();
        CommError::Mismatch {
            comm: comm.to_owned(),
            members,
            culprits,
            calls,
        }
    }

    /// The ranks at the root of this failure that were lost (dead or missing), as member ids (world ranks in a
    /// collection): the root cause's ranks when a peer recorded one, else the dead or missing ranks this rank saw.
    /// Empty for errors that lose no rank (a disagreement, a cycle of waits, a deliberate abort, a bad argument).
    /// Pass them to `ShrunkLayout::without_replicas_of` to rebuild without them.
    pub fn lost_ranks(&self) -> &[usize] {
        match self.root_cause() {
            Some(c) if !c.fault.loses_ranks() => &[],
            Some(c) => &c.ranks,
            None => match self {
                CommError::Timeout { missing, .. } => missing,
                CommError::PeerDied { ranks, .. } => ranks,
                CommError::AbortedByPeer { lost, .. } => lost,
                _ => &[],
            },
        }
    }

    /// The ranks to blame for this failure, as member ids: [`lost_ranks`](Self::lost_ranks), or the ranks whose
    /// arguments disagreed (directly, [`CommError::Mismatch`], or as a recorded root cause).
    pub fn culprits(&self) -> &[usize] {
        match (self, self.root_cause()) {
            (CommError::Mismatch { culprits, .. }, _) => culprits,
            (_, Some(c)) => &c.ranks,
            _ => self.lost_ranks(),
        }
    }

    /// The root cause a peer recorded, when this error was caused by a failure elsewhere and its record arrived.
    pub fn root_cause(&self) -> Option<&RootCause> {
        match self {
            CommError::Timeout { cause, .. } | CommError::AbortedByPeer { cause, .. } => {
                cause.as_deref()
            }
            CommError::Broken { root, .. } => root.as_deref(),
            _ => None,
        }
    }

    /// Whether this error leaves the communicator unusable (timeouts, dead peers, I/O and protocol failures).
    /// Argument errors and rank disagreements do not: every rank skipped the same operation.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            CommError::UnsupportedOption { .. }
                | CommError::OptionNeedsNewerLibrary { .. }
                | CommError::Unavailable { .. }
                | CommError::InvalidArgument { .. }
                | CommError::Mismatch { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(ranks: &[usize], call: &str) -> Call {
        Call {
            ranks: ranks.to_vec(),
            call: call.into(),
        }
    }

    #[test]
    fn the_minority_is_blamed_and_a_tie_blames_the_side_without_the_first_member() {
        // Member ids [4, 6, 9]: 9 and 4 agree, 6 is the odd one out, whatever its position.
        let e = CommError::mismatch(
            "c",
            vec![4, 6, 9],
            vec![call(&[9, 4], "a(count=4)"), call(&[6], "a(count=5)")],
        );
        assert_eq!(e.culprits(), [6]);
        assert_eq!(
            e.lost_ranks(),
            [] as [usize; 0],
            "a disagreement loses no rank"
        );
        assert_eq!(
            e.to_string(),
            "communicator c (members [4, 6, 9]): ranks disagree: rank(s) [6] called a(count=5) but rank(s) \
             [4, 9] called a(count=4)"
        );
        // Two members, one each: the first member's call is the reference.
        let e = CommError::mismatch("c", vec![3, 2], vec![call(&[2], "x"), call(&[3], "y")]);
        assert_eq!(e.culprits(), [2]);
        // Three sides: everyone outside the largest is blamed.
        let e = CommError::mismatch(
            "c",
            vec![0, 1, 2, 3],
            vec![call(&[0], "x"), call(&[1, 2], "y"), call(&[3], "z")],
        );
        assert_eq!(e.culprits(), [0, 3]);
        assert!(
            matches!(&e, CommError::Mismatch { calls, .. } if calls.last().unwrap().call == "y")
        );
    }

    #[test]
    fn a_recorded_root_cause_decides_the_lost_ranks() {
        let cause = RootCause {
            ranks: vec![2],
            fault: Fault::Missing,
            comm: "m/tp/1".into(),
            seen_by: 3,
            detail: "all_reduce(#4)".into(),
        };
        let e = CommError::Timeout {
            comm: "m/dp/1".into(),
            members: vec![1, 3],
            missing: vec![3],
            after: Duration::from_secs(2),
            during: "all_reduce(#4)".into(),
            cause: Some(Box::new(cause.clone())),
        };
        assert_eq!(e.lost_ranks(), [2], "not the stuck survivor 3");
        assert_eq!(
            e.to_string(),
            "communicator m/dp/1 (members [1, 3]): rank(s) [3] did not respond within 2s (in all_reduce(#4)); \
             root cause: rank(s) [2] did not respond (seen by rank 3 in communicator m/tp/1: all_reduce(#4))"
        );
        let disagreed = RootCause {
            fault: Fault::Disagreed,
            ..cause
        };
        let e = CommError::AbortedByPeer {
            comm: "m/dp/0".into(),
            members: vec![0, 2],
            by: 2,
            during: "all_reduce(#4)".into(),
            lost: vec![],
            cause: Some(Box::new(disagreed)),
        };
        assert_eq!(e.lost_ranks(), [] as [usize; 0]);
        assert_eq!(e.culprits(), [2]);
    }

    #[test]
    fn a_broken_communicator_blames_the_root_cause_its_domain_settled() {
        // The GPU's watchdog met the timeout first: the user's next call is all that reports it.
        let cause = RootCause {
            ranks: vec![5],
            fault: Fault::Died,
            comm: "m/dp/0/device".into(),
            seen_by: 1,
            detail: "op #2 all_reduce(dtype=f32, count=1)".into(),
        };
        let e = CommError::broken("m/dp/0/device", "timed out", Some(cause.clone()));
        assert_eq!((e.lost_ranks(), e.culprits()), (&[5][..], &[5][..]));
        assert_eq!(e.root_cause(), Some(&cause));
        assert_eq!(
            e.to_string(),
            "communicator m/dp/0/device is broken: timed out"
        );
        // A cycle of waits loses nobody but blames every rank on it.
        let cycle = RootCause {
            ranks: vec![0, 1, 2],
            fault: Fault::Deadlocked,
            ..cause
        };
        let e = CommError::broken("m/pp/0/device", "timed out", Some(cycle));
        assert_eq!((e.lost_ranks(), e.culprits()), (&[][..], &[0, 1, 2][..]));
        assert_eq!(
            Fault::from_name(Fault::Deadlocked.name()),
            Some(Fault::Deadlocked)
        );
        // Without a settled cause, nothing is blamed.
        let e = CommError::broken("c", "aborted", None);
        assert!(e.lost_ranks().is_empty() && e.culprits().is_empty());
    }
}
