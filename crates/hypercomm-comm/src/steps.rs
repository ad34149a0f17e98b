//! [`Step`] and [`StepHook`]: the named points of a host communicator's bootstrap, and a caller's function that
//! runs at each of them (fault injection: a chaos test kills, stalls or panics a rank at a chosen point).
//!
//! The hook is passed explicitly, in [`CommOptions::on_step`](crate::CommOptions::on_step); nothing is registered
//! globally, so two communicators in one process never see each other's hooks. It runs on the thread that reaches
//! the step (for [`Step::SegmentSent`], rank 0's thread that serves the segment to its peers), synchronously: the
//! bootstrap goes on when it returns.

use std::fmt;
use std::sync::Arc;

/// A point of a host communicator's bootstrap. `comm` is the communicator's name; `rank` is the rank (within the
/// communicator) that reached the step.
///
/// Order on rank 0 with shared memory: `SegmentCreated`, `Listening` and `RecordPublished` (unless it is alone), then
/// `SegmentSent` once per peer on the same host (on a thread of its own, interleaved with the rest), `Arrived`,
/// `Decided`, `Ready`.
/// On the other ranks: `RecordRead`, `SegmentReceived` and `SegmentAttached` (same host only), `Arrived`,
/// `Decided`, `Ready`. Over TCP the segment steps are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step<'a> {
    /// Rank 0 created and sized the shared-memory segment (nameless: no peer can reach it yet).
    SegmentCreated {
        /// The communicator.
        comm: &'a str,
    },
    /// Rank 0 listens on the nameless socket its peers on the same host fetch the segment from.
    Listening {
        /// The communicator.
        comm: &'a str,
    },
    /// Rank 0 published its bootstrap record in the store.
    RecordPublished {
        /// The communicator.
        comm: &'a str,
    },
    /// Rank 0 sent the segment to `peer`.
    SegmentSent {
        /// The communicator.
        comm: &'a str,
        /// The rank it went to.
        peer: usize,
    },
    /// A rank other than 0 read rank 0's record.
    RecordRead {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
    },
    /// A rank on rank 0's host received the segment.
    SegmentReceived {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
    },
    /// A rank on rank 0's host mapped the segment and wrote its pid into it.
    SegmentAttached {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
    },
    /// A rank counted itself in: rank 0 by publishing its record (at once after `RecordPublished`), the others by
    /// adding to the store's arrival counter.
    Arrived {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
    },
    /// A rank read the transport decision.
    Decided {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
        /// `"shm"` or `"tcp"`.
        transport: &'static str,
    },
    /// A rank's transport is connected; the bootstrap returns next.
    Ready {
        /// The communicator.
        comm: &'a str,
        /// The rank.
        rank: usize,
    },
}

impl Step<'_> {
    /// Every step's [`name`](Self::name), in bootstrap order.
    pub const NAMES: [&'static str; 10] = [
        "segment_created",
        "listening",
        "record_published",
        "segment_sent",
        "record_read",
        "segment_received",
        "segment_attached",
        "arrived",
        "decided",
        "ready",
    ];

    /// The step's name in `snake_case` (one of [`NAMES`](Self::NAMES)).
    pub fn name(&self) -> &'static str {
        match self {
            Step::SegmentCreated { .. } => "segment_created",
            Step::Listening { .. } => "listening",
            Step::RecordPublished { .. } => "record_published",
            Step::SegmentSent { .. } => "segment_sent",
            Step::RecordRead { .. } => "record_read",
            Step::SegmentReceived { .. } => "segment_received",
            Step::SegmentAttached { .. } => "segment_attached",
            Step::Arrived { .. } => "arrived",
            Step::Decided { .. } => "decided",
            Step::Ready { .. } => "ready",
        }
    }

    /// The communicator being built.
    pub fn comm(&self) -> &str {
        match *self {
            Step::SegmentCreated { comm }
            | Step::Listening { comm }
            | Step::RecordPublished { comm }
            | Step::SegmentSent { comm, .. }
            | Step::RecordRead { comm, .. }
            | Step::SegmentReceived { comm, .. }
            | Step::SegmentAttached { comm, .. }
            | Step::Arrived { comm, .. }
            | Step::Decided { comm, .. }
            | Step::Ready { comm, .. } => comm,
        }
    }

    /// The rank (within the communicator) that reached the step: 0 for rank 0's own steps.
    pub fn rank(&self) -> usize {
        match *self {
            Step::SegmentCreated { .. }
            | Step::Listening { .. }
            | Step::RecordPublished { .. }
            | Step::SegmentSent { .. } => 0,
            Step::RecordRead { rank, .. }
            | Step::SegmentReceived { rank, .. }
            | Step::SegmentAttached { rank, .. }
            | Step::Arrived { rank, .. }
            | Step::Decided { rank, .. }
            | Step::Ready { rank, .. } => rank,
        }
    }
}

impl fmt::Display for Step<'_> {
    /// `segment_sent (communicator tp, rank 0, peer 1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (communicator {}, rank {}",
            self.name(),
            self.comm(),
            self.rank()
        )?;
        if let Step::SegmentSent { peer, .. } = self {
            write!(f, ", peer {peer}")?;
        }
        f.write_str(")")
    }
}

/// A function called at every [`Step`] of a host bootstrap, set in
/// [`CommOptions::on_step`](crate::CommOptions::on_step): nothing is registered globally, so two communicators in
/// one process never see each other's hooks. It runs synchronously on the thread that reaches the step (for
/// [`Step::SegmentSent`], rank 0's thread that serves the segment; a panic there reaches the caller when the
/// bootstrap ends). Cloning shares the function; two hooks are equal when they share one function (so
/// [`CommOptions`](crate::CommOptions) stays comparable).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use hypercomm_comm::{CommOptions, Communicator, Step, StepHook};
/// use hypercomm_store::MemoryStore;
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = Arc::clone(&seen);
/// let options = CommOptions {
///     on_step: Some(StepHook::new(move |step: &Step<'_>| {
///         // A chaos test would call std::process::abort() here, at the step it wants to break.
///         log.lock().unwrap().push(step.name());
///     })),
///     ..CommOptions::named("solo")
/// };
/// let store = Arc::new(MemoryStore::new());
/// let comm = Communicator::world(store, 1, 0, options)?;
/// assert_eq!(
///     *seen.lock().unwrap(),
///     // Alone, rank 0 shares its segment with nobody: it neither listens nor publishes a record.
///     ["segment_created", "arrived", "decided", "ready"]
/// );
/// # drop(comm);
/// # Ok::<(), hypercomm_comm::CommError>(())
/// ```
#[derive(Clone)]
pub struct StepHook(Arc<dyn Fn(&Step<'_>) + Send + Sync>);

impl StepHook {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&Step<'_>) + Send + Sync + 'static) -> StepHook {
        StepHook(Arc::new(f))
    }

    /// Runs the function on `step`.
    pub fn call(&self, step: &Step<'_>) {
        (self.0)(step);
    }
}

impl fmt::Debug for StepHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StepHook(..)")
    }
}

impl PartialEq for StepHook {
    fn eq(&self, other: &StepHook) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_variants_and_display_names_the_peer() {
        let steps = [
            Step::SegmentCreated { comm: "c" },
            Step::Listening { comm: "c" },
            Step::RecordPublished { comm: "c" },
            Step::SegmentSent { comm: "c", peer: 2 },
            Step::RecordRead { comm: "c", rank: 1 },
            Step::SegmentReceived { comm: "c", rank: 1 },
            Step::SegmentAttached { comm: "c", rank: 1 },
            Step::Arrived { comm: "c", rank: 1 },
            Step::Decided {
                comm: "c",
                rank: 1,
                transport: "shm",
            },
            Step::Ready { comm: "c", rank: 1 },
        ];
        let names: Vec<&str> = steps.iter().map(Step::name).collect();
        assert_eq!(names, Step::NAMES);
        assert_eq!(
            steps[3].to_string(),
            "segment_sent (communicator c, rank 0, peer 2)"
        );
        assert_eq!(steps[4].to_string(), "record_read (communicator c, rank 1)");
    }

    #[test]
    fn hooks_compare_by_the_function_they_share() {
        let a = StepHook::new(|_| {});
        let b = StepHook::new(|_| {});
        assert_eq!(a, a.clone());
        assert_ne!(a, b);
    }
}
